"""The dispatcher loop (DESIGN.md 3.5): one process, safe to run on several hosts.

Each loop runs the steps of `STEPS` in order; a step that fails (broker down, a
missing module, a bug) is logged and the loop goes on with the next one:

1. publish: `pending` jobs older than JOBOPS_DISPATCH_PENDING_AFTER_SECONDS and due
   `retrying` jobs, each claimed with `FOR UPDATE SKIP LOCKED` while it is published
   and moved to `queued` on the broker's confirm (two dispatchers never publish the
   same row at once, and the worker's claim fences any duplicate anyway);
2. reap: `running` jobs whose lock went stale -> `retrying` now (audit `reclaimed`),
   or `failed` + a `worker_lost` dead letter once their attempts are used up;
3. the steps other modules own: the event outbox relay, audit checkpoints, the queue
   depths cache for backpressure, the dead-letter watcher.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import structlog
from django.conf import settings
from django.db import IntegrityError, close_old_connections, connection, transaction
from django.utils import timezone
from django.utils.module_loading import import_string
from kombu.exceptions import OperationalError as KombuOperationalError

from audit.services import Actor
from jobs.exceptions import TransitionRefusedError
from jobs.liveness import beat
from jobs.models import Job
from jobs.publisher import job_publish
from jobs.services import STALE_LOCK_SQL, job_reclaim
from jobs.states import Status
from jobs.types import get_type

log = structlog.get_logger("jobs.dispatcher")
REAPER = Actor.system("reaper")

_DUE_SQL = {
    Status.PENDING: (
        "SELECT id, type FROM jobs WHERE status = 'pending' "
        "AND created_at < now() - make_interval(secs => %s) AND id <> ALL(%s::uuid[]) "
        "ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED"
    ),
    Status.RETRYING: (
        "SELECT id, type FROM jobs WHERE status = 'retrying' AND next_run_at <= now() "
        "AND id <> ALL(%s::uuid[]) ORDER BY next_run_at LIMIT 1 FOR UPDATE SKIP LOCKED"
    ),
}
# A job whose publish failed for a reason of its own (unroutable, refused) waits this
# long, doubling to the cap, while the rows behind it go on. Per process: a restarted
# dispatcher tries it again at once, which is only a retry sooner.
PUBLISH_BACKOFF_SECONDS = 1.0
PUBLISH_BACKOFF_CAP_SECONDS = 300.0
_backoff: dict[str, tuple[float, float]] = {}  # job id -> (retry after, current delay)
# The broker itself is away: no other row would fare better, so the pass stops.
BROKER_DOWN_ERRORS = (ConnectionError, OSError, KombuOperationalError, socket.timeout)


def _backing_off() -> list[str]:
    now = time.monotonic()
    for job_id in [j for j, (until, _) in _backoff.items() if until <= now]:
        del _backoff[job_id]
    return list(_backoff)


def _back_off(job_id: str) -> float:
    delay = min(
        PUBLISH_BACKOFF_CAP_SECONDS, _backoff.get(job_id, (0, PUBLISH_BACKOFF_SECONDS / 2))[1] * 2
    )
    _backoff[job_id] = (time.monotonic() + delay, delay)
    return delay


def publish_due_once(*, limit: int = 500) -> int:
    """Publish due `pending` and due `retrying` jobs, one row-locked transaction each.

    The row lock (SKIP LOCKED) is held across the publish and the `-> queued` write,
    so a second dispatcher skips the row instead of publishing it again. A worker that
    receives the message meanwhile waits on the lock for its claim, then claims the
    `queued` job.

    Failures are per row: a job whose type no longer exists fails with a dead letter
    (`TYPE_UNKNOWN`, replayable once the type is back); one the broker refuses (e.g.
    unroutable) backs off while the rows behind it are published. A broker that cannot
    be reached ends that pass. The pending and retrying passes run independently: one
    failing does not keep the other from running. Returns the number published.
    """
    published = 0
    errors: list[BaseException] = []
    for status in _DUE_SQL:
        try:
            published += _publish_pass(status, limit=limit - published)
        except Exception as exc:
            log.error("dispatcher_publish_pass_failed", status=str(status), error=repr(exc))
            errors.append(exc)
    if errors and not published:
        raise errors[0]  # the loop reports the step as failed
    return published


def _publish_pass(status: Status, *, limit: int) -> int:
    published = 0
    while published < limit:
        skip = _backing_off()
        params: list[Any] = [skip]
        if status == Status.PENDING:
            params.insert(0, settings.JOBOPS_DISPATCH_PENDING_AFTER_SECONDS)
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(_DUE_SQL[status], params)
                row = cursor.fetchone()
            if row is None:
                return published
            job_id, job_type = str(row[0]), row[1]
            if get_type(job_type) is None:
                _fail_unknown_type(job_id, job_type, status)
                continue
            try:
                with transaction.atomic():  # a failed publish leaves the row as it was
                    job_publish(job_id=job_id, sources=(status,))
            except BROKER_DOWN_ERRORS:
                raise
            except Exception as exc:
                delay = _back_off(job_id)
                log.error("job_publish_failed", job_id=job_id, error=repr(exc), retry_in=delay)
                continue
        _backoff.pop(job_id, None)
        published += 1
    return published


def _fail_unknown_type(job_id: str, job_type: str, status: str) -> None:
    """A job of a type this deployment no longer has cannot be published anywhere."""
    from dlq.services import job_fail_with_dead_letter

    job_fail_with_dead_letter(
        job_id=job_id,
        reason="nonretryable",
        actor=Actor.system("dispatcher"),
        error_code="TYPE_UNKNOWN",
        error_message=f"job type {job_type!r} is not configured (JOB_TYPES)"[:500],
        sources=[status],
    )
    log.error("job_type_unknown_dead_lettered", job_id=job_id, job_type=job_type)


def reap_once(*, limit: int = 500) -> dict[str, int]:
    """Reclaim `running` jobs whose worker stopped heartbeating (DESIGN.md 3.6).

    The stale-lock condition is re-checked inside each compare-and-set, so a heartbeat
    that lands meanwhile wins, and two reapers never both act on one job.
    """
    from dlq.services import job_fail_with_dead_letter

    timeout = float(settings.JOBOPS_LOCK_TIMEOUT)
    counts = {"reclaimed": 0, "worker_lost": 0}
    # A candidate list by the local clock; the compare-and-set decides by the database's.
    stale = Job.objects.filter(
        status=Status.RUNNING, locked_at__lt=timezone.now() - timedelta(seconds=timeout)
    ).values_list("id", "attempts", "max_attempts")[:limit]
    for job_id, attempts, max_attempts in list(stale):
        if attempts < max_attempts:
            if job_reclaim(job_id=job_id, lock_timeout=timeout) is not None:
                counts["reclaimed"] += 1
                log.warning("job_reclaimed", job_id=str(job_id), attempt=attempts)
            continue
        try:
            job_fail_with_dead_letter(
                job_id=job_id,
                reason="worker_lost",
                actor=REAPER,
                error_code="WORKER_LOST",
                error_message=f"the worker was lost on attempt {attempts} of {max_attempts}",
                where=STALE_LOCK_SQL,
                where_params=[timeout],
            )
        except TransitionRefusedError:
            continue  # a heartbeat or another reaper got there first
        except IntegrityError:
            # An open dead letter exists already (e.g. recorded by the watcher).
            log.error("reaper_dead_letter_exists", job_id=str(job_id))
            continue
        counts["worker_lost"] += 1
        log.error("job_worker_lost", job_id=str(job_id), attempt=attempts)
    return counts


# The loop's steps, in order: (name, dotted path of a no-argument callable).
STEPS: list[tuple[str, str]] = [
    ("publish", "jobs.dispatcher.publish_due_once"),
    ("reap", "jobs.dispatcher.reap_once"),
    ("outbox", "jobs.events.outbox_relay_once"),
    ("checkpoint", "audit.checkpoints.checkpoint_write_if_due"),
    ("queue_depths", "jobs.backpressure.queue_depths_refresh"),
    ("dlq_watch", "dlq.watcher.watch_once"),
    # Background replays and discards (dlq/bulk.py): one chunk per loop.
    ("dlq_bulk", "dlq.bulk.bulk_operations_run_once"),
]


def dispatch_once(*, steps: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """Run every step once; a failing step is logged and reported, never fatal."""
    report: dict[str, Any] = {}
    for name, path in steps or STEPS:
        if not connection.in_atomic_block:
            close_old_connections()  # a database restart must not wedge the loop
        try:
            step: Callable[[], Any] = import_string(path)
            report[name] = step()
        except Exception as exc:
            log.error("dispatcher_step_failed", step=name, error=repr(exc))
            report[name] = {"error": repr(exc)}
    return report


def dispatch_forever(*, interval: float, stop: threading.Event | None = None) -> None:
    stop = stop or threading.Event()
    log.info("dispatcher_started", interval=interval)
    while not stop.is_set():
        started = time.monotonic()
        beat("dispatcher")
        dispatch_once()
        stop.wait(max(0.0, interval - (time.monotonic() - started)))
    log.info("dispatcher_stopped")
