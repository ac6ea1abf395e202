# The Celery app is loaded with Django so that publishing (jobs.publisher) and
# `celery -A config worker` share one configuration.
from config.celery import app as celery_app

__all__ = ["celery_app"]
