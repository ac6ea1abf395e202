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
from jobs.domain.errors import ResultInvalidError
from jobs.domain.exceptions import JobLost
from jobs.domain.progress import metrics_checked
from jobs.domain.states import Status
from jobs.integrations import metrics
from jobs.models import Job
from jobs.queries import QUERIES
from jobs.services.transitions import Fence, Progress, change, job_progress_audit, moved

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
    if org_id is None:  # a message that names no organisation: the job's own
        org_id = Job.objects.filter(id=job_id).values_list("org_id", flat=True).first()
        if org_id is None:
            return None
    claimed = jobs_claim_delivered(job_ids=[job_id], locked_by=locked_by, org_id=org_id)
    return next(iter(claimed.values()), None)


def jobs_claim_delivered(
    *, job_ids: list[uuid.UUID | str], locked_by: str, org_id: int
) -> dict[uuid.UUID, Job]:
    """`job_claim` of several delivered messages of one organisation in one statement
    (jobs_claim_delivered, jobs/sql/20_transitions.sql): each job claimed as there, with
    its own `started` entry on its own chain. Returns the claimed jobs by id; an id that
    is not among them was not claimable (`job_claim`'s None). An id named twice is
    claimed once (the second message is a duplicate)."""
    ids: list[uuid.UUID | str] = list(dict.fromkeys(uuid.UUID(str(i)) for i in job_ids))
    rows = change(
        "jobs_claim_delivered", job_ids=ids, actor=WORKER, locked_by=locked_by, org_id=org_id
    )
    return {job.id: job for job in moved("jobs_claim_delivered", rows, claim=True)}


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
    jobs_claim_polled claiming them all (the compare-and-set of `job_claim`: each job's lock,
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
        rows = change("jobs_claim_polled", job_ids=ids, actor=WORKER, locked_by=locked_by)
        claimed = moved("jobs_claim_polled", rows, claim=True)
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
    *,
    job_id: uuid.UUID | str,
    fence: Fence,
    percent: int,
    step: str | None,
    message: str | None,
    measured: dict[str, int | float] | None = None,
) -> None:
    """Write one (coalesced) progress value and audit it, fenced, in one statement;
    bumps `version` (the ETag moves). The entry records the percent the row holds
    after the write (progress never goes back within the attempt); `measured`, its
    metrics, go on the row only (bounded: ProgressMetricsError, jobs.domain.progress)."""
    value = Progress(max(0, min(100, int(percent))), step, message, metrics_checked(measured))
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
    written = jobs_succeed(
        locked_by=fence.locked_by,
        ends=[(job_id, fence.attempt)],
        results=[result],
        progress=[progress],
    )
    return _one(job_id, fence, written)


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
    job waits for its probe, docs/connectors.md; jobs_retry_held); `extend_attempts`:
    the attempts its budget grows by, as the entry says (1 on its last attempt, which
    jobs_retry_held grants, 0 otherwise).
    """
    retry = Retry(
        job_id, fence.attempt, delay, error_code, error_message, progress, breaker, extend_attempts
    )
    write = jobs_retry_held if breaker else jobs_retry
    return _one(job_id, fence, write(locked_by=fence.locked_by, retries=[retry]))


def job_cancel_confirm(
    *, job_id: uuid.UUID | str, fence: Fence, progress: dict[str, Any] | None = None
) -> Job:
    """`running` -> `cancelled` by the lock holder after its handler saw the flag."""
    return _one(
        job_id,
        fence,
        jobs_cancel_confirm(
            locked_by=fence.locked_by, ends=[(job_id, fence.attempt)], progress=[progress]
        ),
    )


def _one(job_id: uuid.UUID | str, fence: Fence, written: list[Job]) -> Job:
    if not written:
        raise _lost(job_id, fence)
    return written[0]


def _progress(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """A last progress value as the functions take it (percent, step, message and its
    metrics, if any), or None."""
    progress = Progress.from_value(value)
    return None if progress is None else progress.as_value()


def _flushed(
    ends: list[tuple[uuid.UUID | str, int]], progress: list[dict[str, Any] | None]
) -> frozenset[str]:
    """The ids of the jobs that carry a last progress value (counted as a progress write)."""
    return frozenset(str(job_id) for (job_id, _), p in zip(ends, progress, strict=True) if p)


def jobs_succeed(
    *,
    locked_by: str,
    ends: list[tuple[uuid.UUID | str, int]],
    results: list[dict[str, Any] | None],
    progress: list[dict[str, Any] | None],
    providers: list[str | None] | None = None,
) -> list[Job]:
    """jobs_succeed (jobs/sql/20_transitions.sql): `ends` (job id, attempt) of the lock
    holder `locked_by` -> `succeeded`, each with its result and last progress value (and
    the provider that ran it, in its entry, for a connector with providers); returns the
    jobs written (a job whose fence failed is not among them)."""
    flushed = [_progress(p) for p in progress]
    rows = change(
        "jobs_succeed",
        job_ids=[job_id for job_id, _ in ends],
        actor=WORKER,
        data=_providers(ends, providers),
        attempts=[attempt for _, attempt in ends],
        locked_by=locked_by,
        results=results,
        progress=flushed,
    )
    return moved("jobs_succeed", rows, flushed=_flushed(ends, progress))


@dataclass(frozen=True)
class Retry:
    """One run that ends in a retry: its job and attempt, the wait, the error and the
    last progress value; for a retry its connector's breaker holds (jobs_retry_held),
    the breaker's state and the attempts its budget grows by."""

    job_id: uuid.UUID | str
    attempt: int
    delay: float
    error_code: str
    error_message: str
    progress: dict[str, Any] | None = None
    breaker: str | None = None
    extend_attempts: int = 0
    provider: str | None = None


def jobs_retry(*, locked_by: str, retries: list[Retry]) -> list[Job]:
    """jobs_retry (jobs/sql/20_transitions.sql) of `retries` by `locked_by`, each entry
    with its error code and delay. Returns the jobs written."""
    return _retries("jobs_retry", locked_by, retries, {})


def jobs_retry_held(*, locked_by: str, retries: list[Retry]) -> list[Job]:
    """jobs_retry_held (jobs/sql/20_transitions.sql) of `retries` by `locked_by`: each
    job waits for its connector's probe, its entry saying the breaker's state and the
    attempts its budget grows by (docs/connectors.md). Returns the jobs written."""
    held = {
        str(r.job_id): {"breaker": r.breaker, "attempts_extended": r.extend_attempts}
        for r in retries
    }
    return _retries("jobs_retry_held", locked_by, retries, held)


def _retries(
    name: str, locked_by: str, retries: list[Retry], held: dict[str, dict[str, Any]]
) -> list[Job]:
    flushed = [_progress(r.progress) for r in retries]
    rows = change(
        name,
        job_ids=[r.job_id for r in retries],
        actor=WORKER,
        data={
            str(r.job_id): {
                "error_code": r.error_code,
                "delay_ms": round(r.delay * 1000),
                **held.get(str(r.job_id), {}),
                **({"provider": r.provider} if r.provider else {}),
            }
            for r in retries
        },
        attempts=[r.attempt for r in retries],
        locked_by=locked_by,
        run_in=[float(r.delay) for r in retries],
        codes=[r.error_code for r in retries],
        messages=[r.error_message[:2000] for r in retries],
        progress=flushed,
    )
    ends = [(r.job_id, r.attempt) for r in retries]
    return moved(name, rows, flushed=_flushed(ends, [r.progress for r in retries]))


def jobs_cancel_confirm(
    *,
    locked_by: str,
    ends: list[tuple[uuid.UUID | str, int]],
    progress: list[dict[str, Any] | None],
    providers: list[str | None] | None = None,
) -> list[Job]:
    """jobs_cancel_confirm (jobs/sql/20_transitions.sql): `ends` (job id, attempt) of
    `locked_by` -> `cancelled`, each with its last progress value (and provider)."""
    flushed = [_progress(p) for p in progress]
    rows = change(
        "jobs_cancel_confirm",
        job_ids=[job_id for job_id, _ in ends],
        actor=WORKER,
        data=_providers(ends, providers),
        attempts=[attempt for _, attempt in ends],
        locked_by=locked_by,
        progress=flushed,
    )
    return moved("jobs_cancel_confirm", rows, flushed=_flushed(ends, progress))


def _providers(
    ends: list[tuple[uuid.UUID | str, int]], providers: list[str | None] | None
) -> dict[str, dict[str, Any]]:
    """Each end's entry data naming the provider that ran it (none without one)."""
    return {
        str(job_id): {"provider": provider}
        for (job_id, _), provider in zip(ends, providers or [None] * len(ends), strict=True)
        if provider
    }
