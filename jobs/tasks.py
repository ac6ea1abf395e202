"""Thin Celery entry points: one task `jobs.<type>` per row of the types table.

Each takes the wire payload (docs/architecture.md) and hands it to
`jobs.processes.runtime.job_execute`, the Celery adapter of the execution core
(jobs.execution), which holds all the logic. Time limits come from the table
(config/celery.py annotations); acks are late and failures are rejected, never acked.
At worker init the adapter learns which pool runs the tasks (`_configure_pool`): under
Celery's threads pool their claims and ends are batched and the core enforces the hard limits.
"""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task
from celery.concurrency import get_implementation
from celery.concurrency.thread import TaskPool as ThreadsPool
from celery.signals import worker_init, worker_shutdown
from celery.utils.log import get_logger

from core.logging import log_context
from core.tracing import configure_tracing, flush_tracing
from jobs.domain.types import all_types


def _make_task(name: str) -> Task:
    # No Celery result row: the job row is the result (docs/architecture.md), and a result
    # write per job would double the database work of a short job.
    @shared_task(name=name, bind=True, ignore_result=True)
    def run(self: Task, payload: Any) -> dict[str, Any]:
        from jobs.processes.runtime import job_execute

        # Every line of this delivery (ours, Celery's, a handler's, its libraries')
        # carries the ids that tie it to the request that made the job.
        ids = payload if isinstance(payload, dict) else {}
        info = self.request.delivery_info or {}
        with log_context(
            job_id=ids.get("job_id"),
            request_id=ids.get("request_id"),
            correlation_id=ids.get("correlation_id"),
            attempt=ids.get("attempt"),
            idempotency_key=ids.get("job_id"),
            routing_key=info.get("routing_key"),
            queue=info.get("routing_key"),
        ):
            return job_execute(payload=payload, hostname=self.request.hostname)

    return run


TASKS: dict[str, Task] = {t.task_name: _make_task(t.task_name) for t in all_types().values()}


logger = get_logger("jobops.worker")


@worker_init.connect
def _configure_pool(sender: Any = None, **_: Any) -> None:
    """Tell the Celery adapter which pool runs its tasks
    (jobs.processes.runtime.configure_pool). Connected when Celery imports this module
    at the worker's start, before the worker sends the signal."""
    from jobs.processes.runtime import configure_pool

    pool = get_implementation(sender.pool_cls)
    threads = isinstance(pool, type) and issubclass(pool, ThreadsPool)
    configure_pool(threads=threads, concurrency=int(sender.concurrency), hostname=sender.hostname)
    if threads:
        logger.info("threads pool: claims and ends batched across %s tasks", sender.concurrency)
        # No pool child to trace in (worker_process_init is prefork's): the tasks run in
        # this process.
        configure_tracing("worker")
        worker_shutdown.connect(_flush_threads_pool_traces, weak=False)


def _flush_threads_pool_traces(**_: Any) -> None:
    flush_tracing()
