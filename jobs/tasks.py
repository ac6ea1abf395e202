"""Thin Celery entry points: one task `jobs.<type>` per row of the types table.

Each takes the wire payload (DESIGN.md 3.5) and hands it to `jobs.runtime.job_execute`,
which holds all the logic. Time limits come from the table (config/celery.py
annotations); acks are late and failures are rejected, never acked.
"""

from __future__ import annotations

from typing import Any

from celery import Task

from config.celery import app
from jobs.types import all_types


def _make_task(name: str) -> Task:
    @app.task(name=name, bind=True)
    def run(self: Task, payload: Any) -> dict[str, Any]:
        from jobs.runtime import job_execute

        return job_execute(payload=payload, hostname=self.request.hostname)

    return run


TASKS: dict[str, Task] = {t.task_name: _make_task(t.task_name) for t in all_types().values()}
