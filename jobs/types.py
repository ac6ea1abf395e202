"""Read access to the job types table in settings (docs/architecture.md#job-types-and-handlers)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string


@dataclass(frozen=True)
class JobType:
    name: str
    category: str
    # How long an idempotency key returns its job, and how long a job is kept once it
    # ended: its category's (JOBOPS_KEY_TTL, JOBOPS_RETENTION) unless the type sets one.
    key_ttl: timedelta
    retention: timedelta
    queue: str
    # Its category's (JOBOPS_CATEGORY_RETRIES) unless the type sets its own.
    max_retries: int
    backoff_cap: int
    soft_time_limit: int
    time_limit: int
    params_serializer: str
    handler: str

    @property
    def max_attempts(self) -> int:
        return self.max_retries + 1

    @property
    def work_budget(self) -> float:
        """Seconds of planned work a job of this type may have: JOBOPS_WORK_BUDGET_FRACTION
        of its soft time limit (the params schemas that estimate their work check it)."""
        return self.soft_time_limit * settings.JOBOPS_WORK_BUDGET_FRACTION

    @property
    def task_name(self) -> str:
        return f"jobs.{self.name}"

    def load_params_serializer(self) -> Any:
        return import_string(self.params_serializer)

    def load_handler(self) -> Any:
        return import_string(self.handler)


# (the settings they were built from, the types): rebuilt when one of those settings is
# another object (override_settings), not on every lookup (the publisher asks once per job).
_built: tuple[tuple[Any, ...], dict[str, JobType]] | None = None


def all_types() -> dict[str, JobType]:
    global _built
    table = settings.JOB_TYPES
    sources = (
        table,
        settings.JOBOPS_KEY_TTL,
        settings.JOBOPS_RETENTION,
        settings.JOBOPS_CATEGORY_RETRIES,
    )
    if _built is None or any(a is not b for a, b in zip(_built[0], sources, strict=True)):
        _built = (sources, {name: _build(name, spec) for name, spec in table.items()})
    return dict(_built[1])


def _build(name: str, spec: dict[str, Any]) -> JobType:
    category = spec["category"]
    return JobType(
        name=name,
        **{
            "key_ttl": settings.JOBOPS_KEY_TTL[category],
            "retention": settings.JOBOPS_RETENTION[category],
            **settings.JOBOPS_CATEGORY_RETRIES[category],
            **spec,
        },
    )


def get_type(name: str) -> JobType | None:
    return all_types().get(name)


def primary_queue_names() -> list[str]:
    """The primary queues, in table order, without repeats."""
    return list(dict.fromkeys(t.queue for t in all_types().values()))


# A queue's executor (settings.JOBOPS_QUEUE_EXECUTORS, docs/postgres-executor.md).
CELERY, POSTGRES = "celery", "postgres"


def queue_executor(queue: str) -> str | None:
    """`celery` or `postgres` for a queue of the types table; None for any other name."""
    return settings.JOBOPS_QUEUE_EXECUTORS.get(queue)


def postgres_queues() -> list[str]:
    """The queues `manage.py run_worker` runs (JOBOPS_EXECUTOR_<QUEUE>=postgres), in table
    order: the dispatcher publishes none of their jobs to the broker."""
    return [q for q in primary_queue_names() if queue_executor(q) == POSTGRES]
