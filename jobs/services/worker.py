"""A worker's writes to the job it runs (docs/architecture.md#claim-heartbeat-reaper).

Every write after the claim is fenced (`Fence(locked_by, attempt)`): zero rows means
the job was reclaimed from under the worker, and JobLost is raised; the worker then
stops and writes nothing more.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from audit.canonical import canonical_bytes
from audit.services import Actor
from core.json import json_problem
from jobs import metrics
from jobs.errors import ResultInvalidError
from jobs.exceptions import JobLost, TransitionRefusedError
from jobs.models import Job
from jobs.queries import QUERIES
from jobs.services.transitions import Fence, Progress, job_progress_audit, transition
from jobs.states import Status

WORKER = Actor.system("worker")


def backoff_delay(*, attempt: int, cap: float, base: float | None = None) -> float:
    """Delay before attempt n+1 (docs/architecture.md): min(cap, base * 2**(n-1)) * U(0.5, 1.5)."""
    base = settings.JOBOPS_BACKOFF_BASE_SECONDS if base is None else base
    return min(cap, base * 2 ** (max(attempt, 1) - 1)) * random.uniform(0.5, 1.5)


def retry_delay(*, attempt: int, cap: float, retry_after: float | None = None) -> float:
    """The wait before the next attempt: the backoff, or the connector's own Retry-After
    when that is longer (docs/connectors.md#provider-aware-backoff), honoured up to
    JOBOPS_RETRY_AFTER_MAX_SECONDS."""
    delay = backoff_delay(attempt=attempt, cap=cap)
    if retry_after is not None:
        delay = max(delay, min(float(retry_after), settings.JOBOPS_RETRY_AFTER_MAX_SECONDS))
    return delay


def job_claim(*, job_id: uuid.UUID | str, locked_by: str, org_id: int | None = None) -> Job | None:
    """Claim a job for one run (docs/architecture.md); None when it is not claimable.

    One compare-and-set from `pending`/`queued`, or a due `retrying`, of an
    organisation that is not suspended, in a queue that is not paused (and, with
    `org_id`, the message's tenant: only a job of that organisation); it takes the
    lock, counts the attempt and resets progress to zero (progress is the attempt's,
    monotonic within it: a retry does not show the last attempt's 99 %). None means
    the message is a duplicate or stale, the job runs elsewhere, its organisation is
    suspended or is not the message's, its queue is paused: the caller reads which
    (jobs.selectors.job_claim_state) and acks, holds or fails it.
    No attempt is counted for a job not claimed.
    """
    try:
        return transition(
            job_id=job_id,
            target=Status.RUNNING,
            sources=[Status.PENDING, Status.QUEUED, Status.RETRYING],
            actor=WORKER,
            claim_for=locked_by,
            org_id=org_id,
            org_active=True,
            queue_active=True,
        )
    except TransitionRefusedError:
        return None


def _lost(job_id: uuid.UUID | str, fence: Fence) -> JobLost:
    return JobLost(f"job {job_id}: lock {fence.locked_by} attempt {fence.attempt} lost")


def _fenced(job_id: uuid.UUID | str, fence: Fence, **params: Any) -> dict[str, Any]:
    return {"job_id": job_id, "locked_by": fence.locked_by, "attempt": fence.attempt, **params}


def job_heartbeat(*, job_id: uuid.UUID | str, fence: Fence) -> bool:
    """Refresh the lock (no `version` bump: a heartbeat is not a change a client sees).

    Returns the job's `cancel_requested`; raises JobLost when the lock is gone.
    """
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["heartbeat"], _fenced(job_id, fence))
        row = cursor.fetchone()
    if row is None:
        raise _lost(job_id, fence)
    return bool(row[0])


def job_lock_state(*, job_id: uuid.UUID | str, fence: Fence) -> bool:
    """Read `cancel_requested` by primary key; JobLost if the fence no longer holds."""
    row = (
        Job.objects.filter(id=job_id)
        .values_list("status", "locked_by", "attempts", "cancel_requested")
        .first()
    )
    if row is None or row[:3] != (Status.RUNNING, fence.locked_by, fence.attempt):
        raise _lost(job_id, fence)
    return bool(row[3])


def job_worker_lock(*, job_id: uuid.UUID | str, fence: Fence) -> None:
    """Lock the job row for a write beside it (an artefact); JobLost unless still held.
    Must run inside the caller's transaction."""
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["worker_lock"], _fenced(job_id, fence))
        if cursor.fetchone() is None:
            raise _lost(job_id, fence)


def job_progress_write(
    *, job_id: uuid.UUID | str, fence: Fence, percent: int, step: str | None, message: str | None
) -> None:
    """Write one (coalesced) progress value and audit it, fenced, in one statement;
    bumps `version` (the ETag moves). The entry records the percent the row holds
    after the write (progress never goes back within the attempt)."""
    value = Progress(max(0, min(100, int(percent))), step, message)
    if not job_progress_audit(job_id=job_id, fence=fence, progress=value, actor=WORKER):
        raise _lost(job_id, fence)
    transaction.on_commit(metrics.PROGRESS_UPDATE.inc)


def validate_result(result: dict[str, Any] | None) -> None:
    """A handler's result must store as canonical JSON within the payload limit; anything
    else (NaN, a huge number, NUL, deep nesting) is a fatal RESULT_INVALID, never a
    database error that would loop through the reaper."""
    if result is None:
        return
    problem = json_problem(result, max_depth=settings.JOBOPS_MAX_JSON_DEPTH)
    if problem is None:
        try:
            size = len(canonical_bytes(result))
        except Exception as exc:  # rfc8785 refuses integers beyond 2**53, for one
            problem = f"is not canonical JSON ({exc})"
        else:
            if size > settings.JOBOPS_MAX_PAYLOAD_BYTES:
                problem = f"is {size} bytes (at most {settings.JOBOPS_MAX_PAYLOAD_BYTES})"
    if problem:
        raise ResultInvalidError(f"the handler's result {problem}"[:500])


def job_succeed(
    *,
    job_id: uuid.UUID | str,
    fence: Fence,
    result: dict[str, Any] | None,
    progress: dict[str, Any] | None = None,
) -> Job:
    """`running` -> `succeeded` by the lock holder; the last progress value is flushed."""
    return _leave_running(
        job_id=job_id,
        fence=fence,
        target=Status.SUCCEEDED,
        progress=progress,
        complete=True,
        fields={"result": result, "last_error_code": None, "last_error_message": None},
    )


def job_retry(
    *,
    job_id: uuid.UUID | str,
    fence: Fence,
    delay: float,
    error_code: str,
    error_message: str,
    progress: dict[str, Any] | None = None,
    breaker: str | None = None,
    extend_attempts: int = 0,
) -> Job:
    """`running` -> `retrying` with `next_run_at = now + delay`; the dispatcher republishes.

    No Celery countdown/ETA: the wait lives in the database, survives a worker restart
    and holds no prefetch slot (docs/architecture.md#outcomes-of-a-run).
    `breaker`: the state of the job's connector's breaker when it is not closed (the
    job waits for its probe, docs/connectors.md); `extend_attempts`: its budget grows
    (`max_attempts`) by this many, as a replay's: a job on its last attempt whose
    failure the breaker saw waits for the probe instead of dead-lettering.
    """
    return _leave_running(
        job_id=job_id,
        fence=fence,
        target=Status.RETRYING,
        progress=progress,
        run_in=delay,
        extend_attempts=extend_attempts,
        fields={"last_error_code": error_code, "last_error_message": error_message[:2000]},
        audit_data={
            "error_code": error_code,
            "delay_ms": round(delay * 1000),
            **({"breaker": breaker, "attempts_extended": extend_attempts} if breaker else {}),
        },
    )


def job_cancel_confirm(
    *, job_id: uuid.UUID | str, fence: Fence, progress: dict[str, Any] | None = None
) -> Job:
    """`running` -> `cancelled` by the lock holder after its handler saw the flag."""
    return _leave_running(job_id=job_id, fence=fence, target=Status.CANCELLED, progress=progress)


def _leave_running(
    *,
    job_id: uuid.UUID | str,
    fence: Fence,
    target: str,
    progress: dict[str, Any] | None,
    **options: Any,
) -> Job:
    """A final transition by the lock holder, carrying the last coalesced progress value
    (docs/architecture.md: it is always flushed on a state transition)."""
    return transition(
        job_id=job_id,
        target=target,
        sources=[Status.RUNNING],
        actor=WORKER,
        fence=fence,
        progress=Progress.from_value(progress),
        **options,
    )
