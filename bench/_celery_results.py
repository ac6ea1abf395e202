"""A peer of bench/executors.py: Celery with django-celery-results, as a Django team
would build a job system from the same packages.

The broker side is the raw baseline's (bench/_raw_celery.py: quorum queue, publisher
confirms, acks late, prefork); on top, `result_backend = "django-db"` and
`task_track_started`, so that each task writes its STARTED row and then its SUCCESS
row to PostgreSQL (`django_celery_results_taskresult`, through the Django ORM of
bench/settings_celery_results.py). The figures are read from those rows: a task's
start is its `date_started`, its end its `date_done`.

The worker runs `celery -A bench._celery_results worker -Q bench_results ...` with
DJANGO_SETTINGS_MODULE=bench.settings_celery_results (Celery's Django fix-up sets
Django up in the worker and closes stale connections around each task).
"""

from __future__ import annotations

import time
from typing import Any

from celery import Celery

from bench._raw_celery import celery_config

QUEUE = "bench_results"
SETTINGS = "bench.settings_celery_results"
TABLE = "django_celery_results_taskresult"

app = Celery("bench_results", set_as_current=False)


def _config() -> dict[str, Any]:
    config = celery_config(QUEUE)
    # Celery's own consumer: jobops' (config.celery) is not part of what such a team has.
    config.pop("worker_consumer")
    return {
        **config,
        "result_backend": "django-db",
        "task_ignore_result": False,
        "task_track_started": True,
    }


app.add_defaults(_config)


@app.task(name="bench.results.noop")
def noop() -> None:
    return None


@app.task(name="bench.results.sleep10")
def sleep10() -> None:
    time.sleep(0.01)


TASKS = {"noop": noop, "sleep10": sleep10}


def declare_and_purge() -> None:
    with app.connection_for_write() as conn:
        queue = app.conf.task_queues[0]
        queue(conn.default_channel).declare()
        queue(conn.default_channel).purge()


class Publisher:
    """One confirmed producer for a phase; each task's submit time kept by its id."""

    def __init__(self) -> None:
        self.submitted: dict[str, float] = {}
        self._producer_cm: Any = None
        self._producer: Any = None

    def __enter__(self) -> Publisher:
        self._producer_cm = app.producer_or_acquire()
        self._producer = self._producer_cm.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._producer_cm.__exit__(*exc)

    def submit(self, kind: str) -> str:
        submitted = time.time()
        result = TASKS[kind].apply_async(producer=self._producer)
        self.submitted[result.id] = submitted
        return str(result.id)
