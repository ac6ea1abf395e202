"""Publishing jobs (DESIGN.md 3.5): a broker confirm moves `pending` -> `queued`.

Only a broker confirm moves a job `pending` -> `queued` (or a due `retrying` ->
`queued`). A publish that fails (broker down, unroutable, nacked) leaves the job as
it was; the dispatcher publishes it later, so nothing accepted is lost. A message
can reach a worker before the confirm is recorded: the claim accepts `pending` and
`queued` alike, and a lost `-> queued` compare-and-set (zero rows) means the job
was already claimed, which is success. The message itself is `jobs.publisher`'s.
"""

from __future__ import annotations

import socket
import time
import uuid
from typing import Any

import structlog
from django.conf import settings
from django.db import connection, transaction
from kombu.exceptions import OperationalError as KombuOperationalError

from audit.services import Actor
from jobs import sql
from jobs.exceptions import TransitionRefusedError
from jobs.models import Job
from jobs.publisher import message_publish
from jobs.services.dead_letters import job_fail_with_dead_letter
from jobs.services.transitions import transition
from jobs.states import Status
from jobs.types import get_type

log = structlog.get_logger("jobs.publishing")
PUBLISHER = Actor.system("publisher")

# After a failed publish, on_commit publishing pauses this long (per broker URL) and
# leaves new jobs `pending` for the dispatcher, so a dead broker costs one request one
# connect timeout, not every request.
BROKER_DOWN_BACKOFF_SECONDS = 5.0
_broker_down_until: dict[str, float] = {}


def job_publish(
    *,
    job_id: uuid.UUID | str,
    sources: tuple[str, ...] | None = None,
    timeout: float | None = None,
) -> bool:
    """Publish a `pending` (or due `retrying`) job; on confirm move it to `queued`.

    1. Read the job; anything not publishable (already queued, running, ended) is
       left alone and False returned.
    2. Publish with confirms + mandatory (raises on failure; the job is unchanged).
    3. Compare-and-set `-> queued`. Zero rows: a worker claimed it first (or it was
       cancelled meanwhile): the publish still succeeded.
    """
    sources = sources or (Status.PENDING, Status.RETRYING)
    job = Job.objects.filter(id=job_id, status__in=sources).first()
    if job is None:
        return False
    message_publish(job=job, timeout=timeout)
    try:
        transition(job_id=job.id, target=Status.QUEUED, sources=[job.status], actor=PUBLISHER)
    except TransitionRefusedError:
        pass
    return True


def job_publish_after_commit(job_id: uuid.UUID | str) -> None:
    """The `transaction.on_commit` hook of job_create: never raises into the API.

    A failure leaves the job `pending`; the dispatcher publishes it later.
    """
    url = settings.BROKER_URL
    if time.monotonic() < _broker_down_until.get(url, 0.0):
        # The broker failed moments ago: do not make every request wait for it again.
        log.info("job_publish_deferred", job_id=str(job_id), error="broker recently down")
        return
    try:
        # A request must not wait long on a slow or blackholed broker: the short
        # timeout leaves the job `pending` for the dispatcher instead.
        job_publish(
            job_id=job_id,
            sources=(Status.PENDING,),
            timeout=settings.JOBOPS_REQUEST_BROKER_TIMEOUT_SECONDS,
        )
    except Exception as exc:  # broker down must not fail the request
        _broker_down_until[url] = time.monotonic() + BROKER_DOWN_BACKOFF_SECONDS
        log.warning("job_publish_deferred", job_id=str(job_id), error=repr(exc))
    else:
        _broker_down_until.pop(url, None)


# --- the dispatcher's publish pass (DESIGN.md 3.5) -----------------------------------------

_DUE = {Status.PENDING: sql.DUE_PENDING, Status.RETRYING: sql.DUE_RETRYING}
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
    for status in _DUE:
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
        params: dict[str, Any] = {
            "skip": _backing_off(),
            "after": settings.JOBOPS_DISPATCH_PENDING_AFTER_SECONDS,
        }
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(_DUE[status], params)
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
    job_fail_with_dead_letter(
        job_id=job_id,
        reason="nonretryable",
        actor=Actor.system("dispatcher"),
        error_code="TYPE_UNKNOWN",
        error_message=f"job type {job_type!r} is not configured (JOB_TYPES)"[:500],
        sources=[status],
    )
    log.error("job_type_unknown_dead_lettered", job_id=job_id, job_type=job_type)
