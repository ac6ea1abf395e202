"""The Django project of the Celery + django-celery-results peer (bench/_celery_results.py).

What a Django team builds from the same packages: one app, django_celery_results, on
the scratch database of DATABASE_URL, with persistent connections (CONN_MAX_AGE), so
that each task's STARTED and SUCCESS rows do not pay for a new connection. None of
jobops' apps, middleware or signal handlers is loaded in its worker.
"""

import os

import dj_database_url

SECRET_KEY = os.environ["SECRET_KEY"]
DATABASES = {"default": dj_database_url.parse(os.environ["DATABASE_URL"], conn_max_age=600)}
INSTALLED_APPS = ["django_celery_results"]
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
