"""The one compare-and-set transition of DESIGN.md 3.4, audited with its event.

Every status change of a job goes through `transition`: one conditional UPDATE, then in
the same transaction the audit entry and the outbox event. Callers say what the
transition does with named options; the SQL is built from the named fragments of
`jobs.sql` and nothing else.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from psycopg.types.json import Jsonb

from audit.services import Actor, audit_append, format_ts, job_chain
from jobs import metrics, sql
from jobs.exceptions import JobLost, TransitionRefusedError
from jobs.models import EventOutbox, Job
from jobs.states import ALLOWED, EVENT_FOR_STATUS, Status

_JOB_COLUMNS = [f.column for f in Job._meta.concrete_fields]
_JOB_ATTNAMES = [f.attname for f in Job._meta.concrete_fields]
# Raw rows skip the ORM's converters; JSON columns arrive as text and need them.
_JOB_CONVERTERS = [
    (i, f.from_db_value)
    for i, f in enumerate(Job._meta.concrete_fields)
    if hasattr(f, "from_db_value")
]
# Plain values a transition may set (`fields=`); anything computed has its own option.
SETTABLE_FIELDS = frozenset(
    {
        "result",
        "last_error_code",
        "last_error_message",
        "dead_letter_queue",
        "next_run_at",
        "progress_percent",
        "progress_step",
        "progress_message",
    }
)


@dataclass(frozen=True)
class Fence:
    """A worker's claim: its writes apply only while it still holds this lock and attempt."""

    locked_by: str
    attempt: int


@dataclass(frozen=True)
class Progress:
    """A progress value {percent, step, message}; written monotonically."""

    percent: int
    step: str | None = None
    message: str | None = None

    @classmethod
    def from_value(cls, value: dict[str, Any] | None) -> Progress | None:
        if not value:
            return None
        percent = max(0, min(100, int(value["percent"])))
        return cls(percent, value.get("step"), value.get("message"))


def transition(
    *,
    job_id: uuid.UUID | str,
    target: str,
    actor: Actor,
    sources: Iterable[str] | None = None,
    fence: Fence | None = None,
    claim_for: str | None = None,
    stale_after: float | None = None,
    run_in: float | None = None,
    progress: Progress | None = None,
    complete: bool = False,
    extend_attempts: int | None = None,
    fields: dict[str, Any] | None = None,
    event_type: str | None = None,
    audit_data: dict[str, Any] | None = None,
) -> Job:
    """Apply one compare-and-set transition and audit it; returns the updated job.

    Options (each a named fragment of `jobs.sql`):
    - `fence`: only while this worker still holds the lock and attempt (else JobLost);
    - `claim_for`: take the lock for this holder, count an attempt; a retrying job only
      when it is due;
    - `stale_after`: only while the lock is older than this many seconds (the reaper);
    - `run_in`: `next_run_at = now() + run_in` seconds;
    - `progress`: a last progress value (monotonic); `complete`: progress 100 %;
    - `extend_attempts`: `max_attempts` grows by this many (a replay's fresh budget);
    - `fields`: plain column values (SETTABLE_FIELDS).
    Leaving `running` always releases the lock (only a running job holds one).

    1. Refuse at once any source -> target pair that jobs.states.ALLOWED lacks.
    2. One conditional UPDATE that also returns the previous status.
    3. Zero rows: JobLost for a fenced write, else TransitionRefusedError naming the
       job's current status. Nothing has changed.
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
    unknown = set(fields or {}) - SETTABLE_FIELDS
    if unknown:
        raise ValueError(f"transition cannot set {sorted(unknown)}")
    params: dict[str, Any] = {"job_id": job_id, "target": target, "sources": list(source_set)}
    assignments: list[str] = []
    conditions: list[str] = []
    if fence is not None:
        conditions.append(sql.WORKER_HOLDS_LOCK)
        params.update(locked_by=fence.locked_by, attempt=fence.attempt)
    if claim_for is not None:
        assignments += sql.SET_CLAIM
        conditions.append(sql.RETRY_IS_DUE)
        params["claim_for"] = claim_for
    elif target != Status.RUNNING:
        assignments += sql.SET_UNLOCK
    if stale_after is not None:
        conditions.append(sql.LOCK_IS_STALE)
        params["stale_after"] = float(stale_after)
    if run_in is not None:
        assignments += sql.SET_RUN_IN
        params["run_in"] = float(run_in)
    if progress is not None:
        assignments += sql.SET_PROGRESS
        percent = 100 if complete else progress.percent
        params.update(percent=percent, step=progress.step, message=progress.message)
    elif complete:
        assignments += sql.SET_PROGRESS_COMPLETE
    if extend_attempts is not None:
        assignments += sql.SET_EXTEND_ATTEMPTS
        params["extend_attempts"] = int(extend_attempts)
    for column, value in (fields or {}).items():
        assignments.append(f"{column} = %(f_{column})s")
        params[f"f_{column}"] = Jsonb(value) if isinstance(value, dict | list) else value
    statement = sql.transition_sql(
        assignments=assignments, conditions=conditions, columns=_JOB_COLUMNS
    )
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(statement, params)
            row = cursor.fetchone()
        if row is None:
            if fence is not None:
                raise JobLost(f"job {job_id}: lock {fence.locked_by} attempt {fence.attempt} lost")
            current = Job.objects.filter(id=job_id).values_list("status", flat=True).first()
            raise TransitionRefusedError(job_id=job_id, current=current, target=target)
        job = _job_from_row(row[1:])
        audit_and_emit(
            job,
            event_type=event_type or EVENT_FOR_STATUS[target],
            previous_status=row[0],
            actor=actor,
            data=audit_data,
        )
        _count_transition(job, target, writes_progress=progress is not None)
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


def job_audit(
    *, job_id: uuid.UUID | str, event_type: str, actor: Actor, data: dict[str, Any] | None = None
) -> None:
    """Audit an event that changes no status (progress, cancel_requested, dead_lettered,
    dlq_discarded) on the job's chain, in the caller's transaction."""
    audit_append(
        chain=job_chain(job_id), event_type=event_type, actor=actor, job_id=job_id, data=data
    )


def audit_and_emit(
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
