import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
application = get_asgi_application()

from config.apps import discover_admin_pages  # noqa: E402  (needs the apps)

discover_admin_pages()  # at start-up, not at the first request
