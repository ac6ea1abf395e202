"""The event stream process (Procfile `events`): `uvicorn config.asgi_events:application`.

It serves only `GET /api/v1/jobs/{id}/events` (jobs/api/stream.py); every other path
is a 404 envelope. The sync API stays under gunicorn (config/wsgi.py).
"""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()

from jobs.api.stream import EventStreamApp  # noqa: E402  (after django.setup)

application = EventStreamApp()
