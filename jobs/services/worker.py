"""A worker's writes to the job it runs (docs/architecture.md#claim-heartbeat-reaper).

Every write after the claim is fenced (`Fence(locked_by, attempt)`): zero rows means
the job was reclaimed from under the worker, and JobLost is raised; the worker then
stops and writes nothing more.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from audit.canonical import canonical_bytes
from audit.services import Actor
from core.db import execute_prepared
from core.json import json_problem
from jobs import metrics
from jobs.errors import ResultInvalidError
from jobs.exceptions import JobLost, TransitionRefusedError
from jobs.models import Job
from jobs.queries import QUERIES
from jobs.services.dead_letters import job_fail_with_dead_letter
from jobs.services.transitions import (
    Each,
    Fence,
    Progress,
    job_progress_audit,
    transition,
    transition_each,
    transition_many,
)
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
    held = jobs_heartbeat(held={job_id: fence})
    if not held:
        raise _lost(job_id, fence)
    return next(iter(held.values()))


def jobs_heartbeat(*, held: dict[Any, Fence]) -> dict[uuid.UUID, bool]:
    """Refresh the locks of every job in `held` (job id -> its fence) in one statement:
    a run_worker host's beat for all the jobs it runs. Returns the cancel flag of each
    job still held; a job missing from the answer was lost (reclaimed)."""
    if not held:
        return {}
    params: dict[str, Any] = {
        "ids": [str(job_id) for job_id in held],
        "locked_by": [fence.locked_by for fence in held.values()],
        "attempts": [fence.attempt for fence in held.values()],
    }
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["heartbeat"], params)
        return {row[0]: bool(row[1]) for row in cursor.fetchall()}


def jobs_claim(
    *, queues: list[str], locked_by: str, limit: int, skip_types: list[str] | None = None
) -> list[Job]:
    """Claim up to `limit` jobs of `queues` for a run_worker host
    (docs/postgres-executor.md): highest priority first, then oldest, skipping paused
    queues, suspended organisations, the types of `skip_types` and rows another
    claimer holds; in one transaction, the locking select (claimable_jobs) and one
    job_append claiming them all (the compare-and-set of `job_claim`: each job's lock,
    attempt and `started` entry and event). Returns the claimed jobs, highest priority
    first."""
    if limit < 1 or not queues:
        return []
    with transaction.atomic():
        # Prepared (planned once per connection): a claim is on the path from a job's
        # creation to its start.
        rows = execute_prepared(
            QUERIES["claimable_jobs"],
            {"queues": queues, "skip_types": skip_types or [], "limit": limit},
        )
        ids = [row[0] for row in rows]
        if not ids:
            return []
        claimed = transition_many(
            job_ids=ids,
            target=Status.RUNNING,
            sources=[Status.PENDING, Status.RETRYING],
            actor=WORKER,
            claim_for=locked_by,
            org_active=True,
            queue_active=True,
            # No broker window to refill, and run_worker's own LISTEN would wake it.
            notify=False,
        )
    order = {job_id: n for n, job_id in enumerate(ids)}
    return sorted(claimed, key=lambda job: order[job.id])


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


@dataclass(frozen=True)
class Finish:
    """How one run of a job ended, as the runtime decided it (jobs.runtime.finish_decide):
    `target` succeeded (with `result`), cancelled, retrying (with `delay` and the error)
    or failed (with the dead letter's `reason` and the error); `progress`, the last
    coalesced progress value, goes with it. Written by the lock holder at `attempt`.
    `job_type` and `seconds` (the run from its claim to this decision) are for its log
    line and job_duration_seconds."""

    job_id: uuid.UUID
    attempt: int
    target: str
    result: dict[str, Any] | None = None
    error_code: str | None = None
    error_message: str | None = None
    delay: float | None = None
    reason: str | None = None
    progress: dict[str, Any] | None = None
    job_type: str = ""
    seconds: float = 0.0
    # A retry its connector's breaker holds (docs/connectors.md): the breaker's state,
    # and how many attempts the job's budget grows by (1 on its last attempt).
    breaker: str | None = None
    extend_attempts: int = 0


def job_finish(*, finish: Finish, fence: Fence) -> None:
    """Write one run's end (a Celery worker's), fenced; JobLost when the job was
    reclaimed. A failure flushes the last progress value, then fails the job with its
    dead letter."""
    job_id, progress = finish.job_id, finish.progress
    if finish.target == Status.SUCCEEDED:
        job_succeed(job_id=job_id, fence=fence, result=finish.result, progress=progress)
    elif finish.target == Status.CANCELLED:
        job_cancel_confirm(job_id=job_id, fence=fence, progress=progress)
    elif finish.target == Status.RETRYING:
        assert finish.delay is not None and finish.error_code is not None
        job_retry(
            job_id=job_id,
            fence=fence,
            delay=finish.delay,
            error_code=finish.error_code,
            error_message=finish.error_message or "",
            progress=progress,
            breaker=finish.breaker,
            extend_attempts=finish.extend_attempts,
        )
    else:
        _fail(finish, fence)


def _fail(finish: Finish, fence: Fence) -> None:
    if finish.progress:
        job_progress_write(job_id=finish.job_id, fence=fence, **finish.progress)
    job_fail_with_dead_letter(
        job_id=finish.job_id,
        reason=finish.reason or "exhausted",
        actor=WORKER,
        error_code=finish.error_code,
        error_message=finish.error_message,
        fence=fence,
    )


def jobs_finish(*, finishes: list[Finish], locked_by: str) -> list[Finish]:
    """Write a window of finished runs of one lock holder (a run_worker host) in batches
    (docs/postgres-executor.md): one job_append per outcome (succeeded, retrying,
    cancelled) for all of that outcome's jobs, each fenced by `locked_by` and its own
    attempt, each with its own entry and event; a failure one at a time, with its
    dead letter (no broker copy: the database row is the dead letter). Returns the
    finishes whose fence failed (their jobs were reclaimed: nothing of theirs is
    written); the others are unaffected."""
    written: set[uuid.UUID] = set()
    # A retry its connector's breaker holds is written alone (job_retry: its own audit
    # data and attempt budget); such retries are few, at an outage's start.
    alone = [f for f in finishes if f.target == Status.FAILED or f.breaker is not None]
    for target in (Status.SUCCEEDED, Status.RETRYING, Status.CANCELLED):
        group = [f for f in finishes if f.target == target and f not in alone]
        if group:
            moved = transition_each(
                each=[_each(f) for f in group],
                target=target,
                actor=WORKER,
                locked_by=locked_by,
                sources=[Status.RUNNING],
                complete=target == Status.SUCCEEDED,
                fields=(
                    {"last_error_code": None, "last_error_message": None}
                    if target == Status.SUCCEEDED
                    else None
                ),
            )
            written.update(job.id for job in moved)
    for finish in alone:
        try:
            job_finish(finish=finish, fence=Fence(locked_by, finish.attempt))
        except JobLost:
            continue
        written.add(finish.job_id)
    return [f for f in finishes if f.job_id not in written]


def _each(finish: Finish) -> Each:
    """A finish as the per-job values of its outcome's batch transition (as job_succeed,
    job_retry and job_cancel_confirm write one)."""
    progress = Progress.from_value(finish.progress)
    if finish.target == Status.SUCCEEDED:
        if progress is not None:  # success writes 100 % with the last step and message
            progress = Progress(100, progress.step, progress.message)
        return Each(
            finish.job_id, finish.attempt, progress=progress, fields={"result": finish.result}
        )
    if finish.target == Status.RETRYING:
        code, delay = finish.error_code, float(finish.delay or 0)
        return Each(
            finish.job_id,
            finish.attempt,
            run_in=delay,
            progress=progress,
            fields={
                "last_error_code": code,
                "last_error_message": (finish.error_message or "")[:2000],
            },
            audit_data={"error_code": code, "delay_ms": round(delay * 1000)},
        )
    return Each(finish.job_id, finish.attempt, progress=progress)
