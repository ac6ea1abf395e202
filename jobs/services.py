"""Write paths for jobs. Every status change goes through `transition`."""

from __future__ import annotations

import hashlib
import random
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import IO, Any

import structlog
from django.conf import settings
from django.core.files import File
from django.core.files.base import ContentFile
from django.db import connection, models, transaction
from django.utils import timezone
from psycopg.types.json import Jsonb

from audit.canonical import canonical_bytes
from audit.services import Actor, audit_append, format_ts, job_chain
from config.tracing import current_traceparent
from core.errors import ApplicationError
from core.json import json_problem
from jobs import metrics
from jobs.errors import ResultInvalidError
from jobs.exceptions import (
    IdempotencyKeyInvalidError,
    IdempotencyMismatchError,
    JobLost,
    JobNotFoundError,
    JobParamsInvalidError,
    JobTypeUnknownError,
    PayloadTooLargeError,
    TransitionRefusedError,
)
from jobs.models import Artefact, EventOutbox, Job
from jobs.states import ALLOWED, EVENT_FOR_STATUS, Status
from jobs.types import get_type

log = structlog.get_logger("jobs.services")

_JOB_COLUMNS = [f.column for f in Job._meta.concrete_fields]
_JOB_ATTNAMES = [f.attname for f in Job._meta.concrete_fields]
# Raw rows skip the ORM's converters; JSON columns arrive as text and need them.
_JOB_CONVERTERS = [
    (i, f.from_db_value)
    for i, f in enumerate(Job._meta.concrete_fields)
    if hasattr(f, "from_db_value")
]
_PRINTABLE_ASCII = frozenset(chr(c) for c in range(0x20, 0x7F))


@dataclass(frozen=True)
class Fence:
    """A worker's claim: its writes apply only while it still holds this lock and attempt."""

    locked_by: str
    attempt: int


class Raw(str):
    """A SQL expression for `transition(set_fields=...)`, e.g. Raw("attempts + 1")."""


def transition(
    *,
    job_id: uuid.UUID | str,
    target: str,
    sources: Iterable[str] | None = None,
    actor: Actor,
    fence: Fence | None = None,
    where: str = "",
    where_params: Iterable[Any] = (),
    set_fields: dict[str, Any] | None = None,
    event_type: str | None = None,
    audit_data: dict[str, Any] | None = None,
) -> Job:
    """Apply one compare-and-set transition of DESIGN.md 3.4 and audit it.

    1. Refuse at once any source -> target pair that the table in jobs.states lacks.
    2. One conditional UPDATE (status IN sources, plus the worker fence and any extra
       condition) that also returns the previous status.
    3. Zero rows: raise JobLost for a fenced write, else TransitionRefusedError naming
       the job's current state. Nothing has changed.
    4. In the same transaction append the audit entry and the outbox event.
    """
    allowed = ALLOWED.get(target, frozenset())
    source_set = frozenset(sources) if sources is not None else allowed
    illegal = source_set - allowed
    if illegal or not source_set:
        raise TransitionRefusedError(
            job_id=job_id,
            current=",".join(sorted(illegal)) or None,
            target=target,
            reason="not an allowed transition",
        )
    assignments = ["status = %s", "version = jobs.version + 1", "updated_at = now()"]
    set_params: list[Any] = [target]
    for column, value in (set_fields or {}).items():
        if isinstance(value, Raw):
            assignments.append(f"{column} = {value}")
        else:
            assignments.append(f"{column} = %s")
            set_params.append(Jsonb(value) if isinstance(value, dict | list) else value)
    conditions = ["jobs.id = old.id", "jobs.status = ANY(%s)"]
    where_values: list[Any] = [list(source_set)]
    if fence is not None:
        conditions.append("jobs.locked_by = %s AND jobs.attempts = %s")
        where_values += [fence.locked_by, fence.attempt]
    if where:
        conditions.append(f"({where})")
        where_values += list(where_params)
    returning = ", ".join(f"jobs.{c}" for c in _JOB_COLUMNS)
    # The FOR UPDATE subquery reads the status this UPDATE replaces (previous_status).
    sql = (
        f"UPDATE jobs SET {', '.join(assignments)} "
        "FROM (SELECT id, status FROM jobs WHERE id = %s FOR UPDATE) AS old "
        f"WHERE {' AND '.join(conditions)} RETURNING old.status, {returning}"
    )
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(sql, [*set_params, job_id, *where_values])
            row = cursor.fetchone()
        if row is None:
            if fence is not None:
                raise JobLost(f"job {job_id}: lock {fence.locked_by} attempt {fence.attempt} lost")
            current = Job.objects.filter(id=job_id).values_list("status", flat=True).first()
            raise TransitionRefusedError(job_id=job_id, current=current, target=target)
        job = _job_from_row(row[1:])
        previous = row[0]
        _audit_and_emit(
            job,
            event_type=event_type or EVENT_FOR_STATUS[target],
            previous_status=previous,
            actor=actor,
            data=audit_data,
        )
        _count_transition(job, target, writes_progress="progress_step" in (set_fields or {}))
    return job


def _count_transition(job: Job, target: str, *, writes_progress: bool) -> None:
    """DESIGN.md 8 counters of a status change, incremented once its transaction commits."""
    if writes_progress:  # a final transition flushing the last coalesced progress value
        transaction.on_commit(metrics.PROGRESS_UPDATE.inc)
    if target == Status.CANCELLED:
        transaction.on_commit(metrics.CANCELLATION.inc)
    elif target == Status.RETRYING:
        counter = metrics.RETRIES.labels(type=job.type, error_code=job.last_error_code or "")
        transaction.on_commit(counter.inc)


def _job_from_row(values: Iterable[Any]) -> Job:
    values = list(values)
    for index, convert in _JOB_CONVERTERS:
        values[index] = convert(values[index], None, connection)
    return Job.from_db(connection.alias, _JOB_ATTNAMES, values)


def _audit_and_emit(
    job: Job,
    *,
    event_type: str,
    previous_status: str | None,
    actor: Actor,
    data: dict[str, Any] | None = None,
) -> None:
    """Audit a transition and write its outbox event, in the caller's transaction."""
    entry = audit_append(
        chain=job_chain(job.id),
        event_type=event_type,
        actor=actor,
        job_id=job.id,
        data={"from": previous_status, "to": job.status, "attempt": job.attempts, **(data or {})},
    )
    event_id = uuid.uuid4()
    EventOutbox.objects.create(
        event_id=event_id,
        job_id=job.id,
        seq=entry.seq,
        payload={
            "event_id": str(event_id),
            "type": "job.status.changed",
            "job_id": str(job.id),
            "job_type": job.type,
            "seq": entry.seq,
            "status": job.status,
            "previous_status": previous_status,
            "progress": job.progress_percent,
            "attempt": job.attempts,
            "timestamp": format_ts(entry.ts),
            # So the ERP bridge's log lines follow the request that made the job.
            "request_id": job.request_id,
            "correlation_id": job.correlation_id,
        },
    )


def params_hash(job_type: str, params: Any) -> str:
    return hashlib.sha256(canonical_bytes({"type": job_type, "params": params})).hexdigest()


def validate_idempotency_key(key: str | None) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str) or not 1 <= len(key) <= 255 or not set(key) <= _PRINTABLE_ASCII:
        raise IdempotencyKeyInvalidError(
            "Idempotency keys are 1 to 255 printable ASCII characters.",
            details={"idempotency_key": ["1 to 255 printable ASCII characters."]},
        )
    return key


def validate_params(job_type: str, params: Any, *, owner: Any = None) -> dict[str, Any]:
    """Check type and params against the types table; return the params to store.

    What is stored (and what the handler receives) is the schema's validated value:
    `{"steps": "20.0"}` becomes `{"steps": 20}`, defaults are filled in.
    """
    spec = get_type(job_type) if isinstance(job_type, str) else None
    if spec is None:
        raise JobTypeUnknownError(
            f"Unknown job type {job_type!r}.",
            details={"type": [f"One of: {', '.join(sorted(settings.JOB_TYPES))}."]},
        )
    if not isinstance(params, dict):
        raise JobParamsInvalidError(details={"params": ["Must be a JSON object."]})
    problem = json_problem(params, max_depth=settings.JOBOPS_MAX_JSON_DEPTH)
    if problem:
        raise JobParamsInvalidError(details={"params": [f"Not storable JSON: it {problem}."]})
    try:
        encoded = canonical_bytes(params)
    except Exception as exc:  # rfc8785 refuses NaN, huge ints, non-string keys
        raise JobParamsInvalidError(details={"params": [f"Not canonical JSON: {exc}"]}) from exc
    if len(encoded) > settings.JOBOPS_MAX_PAYLOAD_BYTES:
        raise PayloadTooLargeError(
            f"params exceed {settings.JOBOPS_MAX_PAYLOAD_BYTES} bytes; "
            "pass large inputs by reference"
        )
    serializer = spec.load_params_serializer()(data=params, context={"spec": spec, "owner": owner})
    if not serializer.is_valid():
        raise JobParamsInvalidError(details=serializer.errors)
    return dict(serializer.validated_data)


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


def job_create(
    *,
    owner: Any,
    job_type: str,
    params: Any,
    idempotency_key: str | None = None,
    request_id: str | None = None,
    correlation_id: str | None = None,
    actor: Actor | None = None,
) -> tuple[Job, bool]:
    """Create a job, or return the one this idempotency key already made.

    1. Validate type, params and key (nothing is written for bad input).
    2. INSERT ... ON CONFLICT DO NOTHING, then read the row by (owner, key): if it is
       ours the job is new; concurrent identical requests all read the one winner.
    3. A different (type, params) under the same key is a mismatch error; a key past
       its retention is released and the insert runs again.
    4. A new job's `created` audit entry and event share the insert's transaction.
    Returns (job, created).
    """
    spec = get_type(job_type) if isinstance(job_type, str) else None
    # A client-chosen type string never becomes a label: unknown types count as one.
    counter = partial(metrics.JOB_CREATE.labels, type=spec.name if spec else "unknown")
    try:
        params = validate_params(job_type, params, owner=owner)
        idempotency_key = validate_idempotency_key(idempotency_key)
    except ApplicationError:
        counter(status="rejected").inc()
        raise
    assert spec is not None
    digest = params_hash(job_type, params)
    actor = actor or Actor.user(owner)
    now = timezone.now()
    candidate = Job(
        type=job_type,
        queue=spec.queue,
        params=params,
        params_hash=digest,
        status=Status.PENDING,
        owner=owner,
        idempotency_key=idempotency_key,
        idempotency_expires_at=(
            now + timedelta(days=settings.JOBOPS_IDEMPOTENCY_KEY_DAYS) if idempotency_key else None
        ),
        max_attempts=spec.max_attempts,
        request_id=request_id,
        correlation_id=correlation_id or request_id,
        traceparent=current_traceparent(),
    )
    with transaction.atomic():
        for _ in range(2):
            Job.objects.bulk_create([candidate], ignore_conflicts=True)
            if idempotency_key is None:
                job = candidate
                break
            job = Job.objects.get(owner=owner, idempotency_key=idempotency_key)
            if job.id == candidate.id:
                break
            if job.idempotency_expires_at and job.idempotency_expires_at <= now:
                job_release_idempotency_keys(job_ids=[job.id])
                continue
            if job.params_hash != digest:
                counter(status="mismatch").inc()
                raise IdempotencyMismatchError(details={"job_id": str(job.id)})
            counter(status="existing").inc()
            return job, False
        _audit_and_emit(job, event_type="created", previous_status=None, actor=actor)
        # Publish only once the row is committed (a worker must find it); a broker
        # failure never reaches the caller: the job stays `pending` for the dispatcher.
        transaction.on_commit(partial(_publish_after_commit, job.id))
        transaction.on_commit(counter(status="created").inc)
    log.info("job_created", job_id=str(job.id), job_type=job_type, queue=job.queue)
    return job, True


def _publish_after_commit(job_id: uuid.UUID) -> None:
    from jobs.publisher import job_publish_after_commit  # publisher imports this module

    job_publish_after_commit(job_id)


def job_release_idempotency_keys(*, job_ids: Iterable[uuid.UUID] | None = None) -> int:
    """Forget keys past their retention (DESIGN.md 3.5) so that a reuse makes a new job."""
    expired = Job.objects.filter(
        idempotency_key__isnull=False, idempotency_expires_at__lte=timezone.now()
    )
    if job_ids is not None:
        expired = expired.filter(id__in=list(job_ids))
    return expired.update(idempotency_key=None, idempotency_expires_at=None)


def job_cancel(*, job_id: uuid.UUID | str, actor: Actor) -> Job:
    """Request cancellation (DESIGN.md 3.7); idempotent.

    1. Raise the flag once (audit `cancel_requested`) unless the job already ended.
    2. A job that has not started moves to `cancelled` now; a running one stops at
       its handler's next check_cancel(). A lost race (it just started) is fine:
       the flag is set and the worker will see it.
    """
    with transaction.atomic():
        flagged = (
            Job.objects.filter(id=job_id, cancel_requested=False)
            .exclude(status__in=[Status.SUCCEEDED, Status.FAILED, Status.CANCELLED])
            .update(
                cancel_requested=True, version=models.F("version") + 1, updated_at=timezone.now()
            )
        )
        if flagged:
            audit_append(
                chain=job_chain(job_id), event_type="cancel_requested", actor=actor, job_id=job_id
            )
        try:
            return transition(
                job_id=job_id,
                target=Status.CANCELLED,
                sources=[Status.PENDING, Status.QUEUED, Status.RETRYING],
                actor=actor,
            )
        except TransitionRefusedError as refused:
            if refused.current is None:
                raise JobNotFoundError() from refused
            return Job.objects.get(id=job_id)


def artefact_save(
    *,
    job_id: uuid.UUID | str,
    kind: str,
    name: str,
    data: bytes | str | IO[bytes],
    content_type: str = "application/octet-stream",
    fence: Fence | None = None,
) -> Artefact:
    """Store a file for a job; an upsert on (job, kind, name), so a rerun replaces it.

    With a `fence` (a worker's write) the job row is locked first and the write refused
    with JobLost unless the worker still holds the job.

    The new file is written to storage first and the row switched to it in one
    statement; the replaced file is deleted only after commit, so a rollback never
    leaves a row pointing at a missing file.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    content = ContentFile(data) if isinstance(data, bytes) else File(data)
    digest, size = hashlib.sha256(), 0
    for chunk in content.chunks():
        digest.update(chunk)
        size += len(chunk)
    content.seek(0)
    with transaction.atomic():
        if fence is not None:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT 1 FROM jobs WHERE id = %s AND status = 'running' AND locked_by = %s "
                    "AND attempts = %s FOR UPDATE",
                    [job_id, fence.locked_by, fence.attempt],
                )
                if cursor.fetchone() is None:
                    raise JobLost(f"job {job_id}: lock {fence.locked_by} lost")
        artefact = (
            Artefact.objects.select_for_update().filter(job_id=job_id, kind=kind, name=name).first()
        )
        old_name = artefact.file.name if artefact else None
        artefact = artefact or Artefact(job_id=job_id, kind=kind, name=name)
        artefact.file.save(name, content, save=False)
        artefact.sha256, artefact.size, artefact.content_type = (
            digest.hexdigest(),
            size,
            content_type,
        )
        artefact.save()
        Job.objects.filter(id=job_id).update(version=models.F("version") + 1)
        if old_name and old_name != artefact.file.name:
            storage = artefact.file.storage
            transaction.on_commit(lambda: storage.delete(old_name))
    return artefact


# --- worker write paths (DESIGN.md 3.3, 3.6-3.8) ------------------------------------
# Every write below made by a worker is fenced (`Fence(locked_by, attempt)`): zero rows
# means the job was reclaimed from under the worker and JobLost is raised.

WORKER = Actor.system("worker")
_FINAL_UNLOCK = {"locked_by": None, "locked_at": None}


def backoff_delay(*, attempt: int, cap: float, base: float | None = None) -> float:
    """Delay before attempt n+1 (DESIGN.md 3.3): min(cap, base * 2**(n-1)) * U(0.5, 1.5)."""
    base = settings.JOBOPS_BACKOFF_BASE_SECONDS if base is None else base
    return min(cap, base * 2 ** (max(attempt, 1) - 1)) * random.uniform(0.5, 1.5)


def job_claim(*, job_id: uuid.UUID | str, locked_by: str) -> Job | None:
    """Claim a job for one run (DESIGN.md 3.6); None when it is not claimable.

    One compare-and-set from `pending`/`queued`, or a due `retrying`; it takes the
    lock and counts the attempt. None means the message is a duplicate or stale, or
    the job runs elsewhere: the caller acks and does nothing.
    """
    try:
        return transition(
            job_id=job_id,
            target=Status.RUNNING,
            sources=[Status.PENDING, Status.QUEUED, Status.RETRYING],
            actor=WORKER,
            where="jobs.status <> 'retrying' OR jobs.next_run_at <= now()",
            set_fields={
                "locked_by": locked_by,
                "locked_at": Raw("now()"),
                "attempts": Raw("jobs.attempts + 1"),
                "next_run_at": None,
            },
        )
    except TransitionRefusedError:
        return None


def job_heartbeat(*, job_id: uuid.UUID | str, fence: Fence) -> bool:
    """Refresh the lock (no `version` bump: a heartbeat is not a change a client sees).

    Returns the job's `cancel_requested`; raises JobLost when the lock is gone.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE jobs SET locked_at = now() WHERE id = %s AND status = 'running' "
            "AND locked_by = %s AND attempts = %s RETURNING cancel_requested",
            [job_id, fence.locked_by, fence.attempt],
        )
        row = cursor.fetchone()
    if row is None:
        raise JobLost(f"job {job_id}: lock {fence.locked_by} attempt {fence.attempt} lost")
    return bool(row[0])


def job_lock_state(*, job_id: uuid.UUID | str, fence: Fence) -> bool:
    """Read `cancel_requested` by primary key; JobLost if the fence no longer holds."""
    row = (
        Job.objects.filter(id=job_id)
        .values_list("status", "locked_by", "attempts", "cancel_requested")
        .first()
    )
    if row is None or row[:3] != (Status.RUNNING, fence.locked_by, fence.attempt):
        raise JobLost(f"job {job_id}: lock {fence.locked_by} attempt {fence.attempt} lost")
    return bool(row[3])


def progress_fields(progress: dict[str, Any] | None) -> dict[str, Any]:
    """Columns for a progress value {percent, step, message}; monotonic in SQL too."""
    if not progress:
        return {}
    percent = max(0, min(100, int(progress["percent"])))
    return {
        "progress_percent": Raw(f"GREATEST(jobs.progress_percent, {percent})"),
        "progress_step": progress.get("step"),
        "progress_message": progress.get("message"),
        "progress_updated_at": Raw("now()"),
    }


def job_progress_write(
    *, job_id: uuid.UUID | str, fence: Fence, percent: int, step: str | None, message: str | None
) -> None:
    """Write one (coalesced) progress value and audit it, fenced; bumps `version`."""
    percent = max(0, min(100, int(percent)))
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE jobs SET progress_percent = GREATEST(progress_percent, %s), "
                "progress_step = %s, progress_message = %s, progress_updated_at = now(), "
                "version = version + 1, updated_at = now() "
                "WHERE id = %s AND status = 'running' AND locked_by = %s AND attempts = %s "
                "RETURNING progress_percent",
                [percent, step, message, job_id, fence.locked_by, fence.attempt],
            )
            row = cursor.fetchone()
        if row is None:
            raise JobLost(f"job {job_id}: lock {fence.locked_by} attempt {fence.attempt} lost")
        transaction.on_commit(metrics.PROGRESS_UPDATE.inc)
        audit_append(
            chain=job_chain(job_id),
            event_type="progress",
            actor=WORKER,
            job_id=job_id,
            data={"percent": row[0], "step": step, "attempt": fence.attempt},
        )


def job_succeed(
    *,
    job_id: uuid.UUID | str,
    fence: Fence,
    result: dict[str, Any] | None,
    progress: dict[str, Any] | None = None,
) -> Job:
    """`running` -> `succeeded` by the lock holder; the last progress value is flushed."""
    return transition(
        job_id=job_id,
        target=Status.SUCCEEDED,
        sources=[Status.RUNNING],
        actor=WORKER,
        fence=fence,
        set_fields={
            **progress_fields(progress),
            "progress_percent": 100,
            "progress_updated_at": Raw("now()"),
            "result": result,
            "last_error_code": None,
            "last_error_message": None,
            **_FINAL_UNLOCK,
        },
    )


def job_retry(
    *,
    job_id: uuid.UUID | str,
    fence: Fence,
    delay: float,
    error_code: str,
    error_message: str,
    progress: dict[str, Any] | None = None,
) -> Job:
    """`running` -> `retrying` with `next_run_at = now + delay`; the dispatcher republishes.

    No Celery countdown/ETA: the wait lives in the database, survives a worker restart
    and holds no prefetch slot (DESIGN.md 3.3).
    """
    return transition(
        job_id=job_id,
        target=Status.RETRYING,
        sources=[Status.RUNNING],
        actor=WORKER,
        fence=fence,
        set_fields={
            **progress_fields(progress),
            "next_run_at": Raw(f"now() + make_interval(secs => {float(delay)!r})"),
            "last_error_code": error_code,
            "last_error_message": error_message[:2000],
            **_FINAL_UNLOCK,
        },
        audit_data={"error_code": error_code, "delay_ms": round(delay * 1000)},
    )


def job_cancel_confirm(
    *, job_id: uuid.UUID | str, fence: Fence, progress: dict[str, Any] | None = None
) -> Job:
    """`running` -> `cancelled` by the lock holder after its handler saw the flag."""
    return transition(
        job_id=job_id,
        target=Status.CANCELLED,
        sources=[Status.RUNNING],
        actor=WORKER,
        fence=fence,
        set_fields={**progress_fields(progress), **_FINAL_UNLOCK},
    )


def job_reclaim(*, job_id: uuid.UUID | str, lock_timeout: float) -> Job | None:
    """The reaper's `running` (stale lock) -> `retrying` now, audited `reclaimed`.

    The stale-lock condition is part of the compare-and-set, so a heartbeat that lands
    first wins and nothing happens (None).
    """
    try:
        return transition(
            job_id=job_id,
            target=Status.RETRYING,
            sources=[Status.RUNNING],
            actor=Actor.system("reaper"),
            where=STALE_LOCK_SQL,
            where_params=[float(lock_timeout)],
            set_fields={
                "next_run_at": Raw("now()"),
                "last_error_code": "WORKER_LOST",
                "last_error_message": "the worker stopped heartbeating; reclaimed",
                **_FINAL_UNLOCK,
            },
            event_type="reclaimed",
            audit_data={"reason": "worker_lost"},
        )
    except TransitionRefusedError:
        return None


# `running` whose lock holder stopped heartbeating (used by the reaper).
STALE_LOCK_SQL = "jobs.locked_at < now() - make_interval(secs => %s)"
