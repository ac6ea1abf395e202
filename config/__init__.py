# Before anything imports prometheus_client: its multiprocess directory must exist by then
# (core/metrics_dir.py). Every process (gunicorn, `celery -A config`, manage.py) imports
# this package first.
from core.metrics_dir import multiprocess_dir_ready

multiprocess_dir_ready()

# The Celery app is loaded with Django so that publishing (jobs.integrations.publisher) and
# `celery -A config worker` share one configuration.
from config.celery import app as celery_app  # noqa: E402

__all__ = ["celery_app"]
