"""The one compare-and-set transition of docs/architecture.md, audited with its event.

Every status change of a job goes through `transition`: one conditional UPDATE, then in
the same transaction the audit entry and the outbox event. Callers say what the
transition does with named options; the SQL is built from the named fragments of
`jobs.sql` and nothing else.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

from django.db import connection, transaction
from django.utils import timezone
from psycopg.types.json import Jsonb

from audit.canonical import GENESIS_HASH, Hole, canonical_bytes, canonical_template, chain_hash
from audit.services import (
    CHECKPOINT_BARRIER,
    Actor,
    audit_payload,
    format_ts,
    job_chain,
)
from core.db import execute_prepared, model_from_row
from jobs import metrics, sql
from jobs.exceptions import JobLost, TransitionRefusedError
from jobs.models import Job
from jobs.states import ALLOWED, EVENT_FOR_STATUS, Status

_JOB_COLUMNS = [f.column for f in Job._meta.concrete_fields]
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


class TransitionOptions(TypedDict, total=False):
    """What a transition does besides the status (each a named fragment of `jobs.sql`).

    - `sources`: the states it may leave (default: every state jobs.states allows);
    - `fence`: only while this worker still holds the lock and attempt (else JobLost);
    - `claim_for`: take the lock for this holder, count an attempt; a retrying job only
      when it is due;
    - `stale_after`: only while the lock is older than this many seconds (the reaper);
    - `run_in`: `next_run_at = now() + run_in` seconds;
    - `progress`: a last progress value (monotonic); `complete`: progress 100 %;
    - `extend_attempts`: `max_attempts` grows by this many (a replay's fresh budget);
    - `fields`: plain column values (SETTABLE_FIELDS);
    - `event_type`: the audit event, when not the target state's own (`reclaimed`...).
    Leaving `running` always releases the lock (only a running job holds one).
    """

    sources: Iterable[str] | None
    fence: Fence | None
    claim_for: str | None
    stale_after: float | None
    run_in: float | None
    progress: Progress | None
    complete: bool
    extend_attempts: int | None
    fields: dict[str, Any] | None
    event_type: str | None


def transition(
    *,
    job_id: uuid.UUID | str,
    target: str,
    actor: Actor,
    audit_data: dict[str, Any] | None = None,
    **options: Unpack[TransitionOptions],
) -> Job:
    """Apply one compare-and-set transition and audit it; returns the updated job.

    1. Refuse at once any source -> target pair that jobs.states.ALLOWED lacks.
    2. One statement (jobs.sql.job_append_sql): the conditional UPDATE, the audit entry
       continuing the chain's head kept on the row, and the outbox event; one round
       trip, atomic by itself (or part of the caller's transaction).
    3. Zero rows: JobLost for a fenced write, else TransitionRefusedError naming the
       job's current status. Nothing has changed.
    """
    changed = transition_many(
        job_ids=[job_id],
        target=target,
        actor=actor,
        audit_data={str(job_id): audit_data} if audit_data else None,
        **options,
    )
    if not changed:
        fence = options.get("fence")
        if fence is not None:
            raise JobLost(f"job {job_id}: lock {fence.locked_by} attempt {fence.attempt} lost")
        current = Job.objects.filter(id=job_id).values_list("status", flat=True).first()
        raise TransitionRefusedError(job_id=job_id, current=current, target=target)
    return changed[0]


def transition_many(
    *,
    job_ids: list[uuid.UUID | str],
    target: str,
    actor: Actor,
    audit_data: dict[str, dict[str, Any]] | None = None,
    **options: Unpack[TransitionOptions],
) -> list[Job]:
    """`transition` for many jobs in one statement (the dispatcher's publish batch, a
    replay chunk); `audit_data` is per job id. Returns the jobs that moved: a job the
    compare-and-set refused is simply not among them."""
    sources = options.get("sources")
    fence, claim_for = options.get("fence"), options.get("claim_for")
    stale_after, run_in = options.get("stale_after"), options.get("run_in")
    progress, complete = options.get("progress"), options.get("complete", False)
    extend_attempts, fields = options.get("extend_attempts"), options.get("fields")
    allowed = ALLOWED.get(target, frozenset())
    source_set = frozenset(sources) if sources is not None else allowed
    illegal = source_set - allowed
    if illegal or not source_set:
        raise TransitionRefusedError(
            job_id=",".join(str(j) for j in job_ids),
            current=",".join(sorted(illegal)) or None,
            target=target,
            reason="not an allowed transition",
        )
    unknown = set(fields or {}) - SETTABLE_FIELDS
    if unknown:
        raise ValueError(f"transition cannot set {sorted(unknown)}")
    params: dict[str, Any] = {"target": target, "sources": list(source_set), "attempt_inc": 0}
    assignments: list[str] = list(sql.SET_STATUS)
    conditions: list[str] = [sql.STATUS_IN_SOURCES]
    if fence is not None:
        conditions.append(sql.WORKER_HOLDS_LOCK)
        params.update(locked_by=fence.locked_by, attempt=fence.attempt)
    if claim_for is not None:
        assignments += sql.SET_CLAIM
        conditions.append(sql.RETRY_IS_DUE)
        params.update(claim_for=claim_for, attempt_inc=1)
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
    entries = {
        job_id: {"from": Hole("from", "text"), "to": target, "attempt": Hole("attempt")}
        | ((audit_data or {}).get(str(job_id)) or {})
        for job_id in job_ids
    }
    rows = _append(
        entries=entries,
        event_type=options.get("event_type") or EVENT_FOR_STATUS[target],
        actor=actor,
        assignments=assignments,
        conditions=conditions,
        params=params,
        emit=True,
        # A job back in `pending` (a replay) waits for the dispatcher: wake it.
        notify=target == Status.PENDING,
    )
    # The statement returns the columns in concrete-field order, as model_from_row reads.
    jobs = [model_from_row(Job, row[1:]) for row in rows]
    for job in jobs:
        _count_transition(job, target, writes_progress=progress is not None)
    return jobs


def _append(
    *,
    entries: dict[Any, dict[str, Any]],
    event_type: str,
    actor: Actor,
    assignments: list[str],
    conditions: list[str],
    params: dict[str, Any],
    emit: bool,
    notify: bool = False,
) -> list[tuple[Any, ...]]:
    """Run jobs.sql.job_append_sql for `entries` (job id -> the entry's data, with its
    Holes): one canonical template per job, cut where the database fills in."""
    ts = timezone.now()
    templates = {
        job_id: canonical_template(
            audit_payload(
                chain=job_chain(job_id),
                seq=Hole("seq"),
                ts=ts,
                event_type=event_type,
                actor=actor,
                job_id=job_id,
                data=data,
            )
        )
        for job_id, data in entries.items()
    }
    holes = [h.name for h in next(iter(templates.values())).holes]
    if any([h.name for h in t.holes] != holes for t in templates.values()):
        raise ValueError("one statement appends entries with the same holes only")
    single = len(templates) == 1
    statement = sql.job_append_sql(
        holes=tuple(holes),
        assignments=tuple(assignments),
        conditions=tuple(conditions),
        columns=tuple(_JOB_COLUMNS),
        emit=emit,
        notify=notify,
        single=single,
    )
    ids: Any = [str(job_id) for job_id in templates]
    pieces: dict[str, Any] = {
        f"p{n}": [t.pieces[n] for t in templates.values()] for n in range(len(holes) + 1)
    }
    if single:  # scalars, not one-element arrays (see job_append_sql)
        ids, pieces = ids[0], {name: values[0] for name, values in pieces.items()}
    params = {
        **params,
        "ids": ids,
        "barrier": CHECKPOINT_BARRIER,
        "event_type": event_type,
        "actor_type": str(actor.type),
        "actor_id": actor.id,
        "ts": ts,
        "ts_text": format_ts(ts),
        **pieces,
    }
    return execute_prepared(statement, params)


def _count_transition(job: Job, target: str, *, writes_progress: bool) -> None:
    """Prometheus counters of a status change, incremented once its transaction commits."""
    if writes_progress:  # a final transition flushing the last coalesced progress value
        transaction.on_commit(metrics.PROGRESS_UPDATE.inc)
    if target == Status.CANCELLED:
        transaction.on_commit(metrics.CANCELLATION.inc)
    elif target == Status.RETRYING:
        counter = metrics.RETRIES.labels(type=job.type, error_code=job.last_error_code or "")
        transaction.on_commit(counter.inc)


def job_audit(
    *,
    job_id: uuid.UUID | str,
    event_type: str,
    actor: Actor,
    data: dict[str, Any] | None = None,
    assignments: list[str] | None = None,
    conditions: list[str] | None = None,
    params: dict[str, Any] | None = None,
) -> tuple[Any, ...] | None:
    """Audit an event that changes no status (progress, cancel_requested, dead_lettered,
    dlq_discarded) on the job's chain, in one statement with the row change it records
    (`assignments` under `conditions`, fragments of jobs.sql). Returns the job's row
    (previous status, then its columns), or None when `conditions` matched nothing."""
    rows = _append(
        entries={job_id: data or {}},
        event_type=event_type,
        actor=actor,
        assignments=assignments or [],
        conditions=conditions or [],
        params={"attempt_inc": 0, **(params or {})},
        emit=False,
    )
    return rows[0] if rows else None


def jobs_audit(*, entries: dict[Any, dict[str, Any]], event_type: str, actor: Actor) -> int:
    """`job_audit` for many jobs in one statement (entries: job id -> the entry's data),
    for an operator's bulk action; returns how many entries were appended."""
    if not entries:
        return 0
    return len(
        _append(
            entries=entries,
            event_type=event_type,
            actor=actor,
            assignments=[],
            conditions=[],
            params={"attempt_inc": 0},
            emit=False,
        )
    )


def job_insert(job: Job, *, actor: Actor) -> bool:
    """Insert a new `pending` job with its `created` entry and event, and wake the
    dispatcher, in one statement (jobs.sql.job_insert_sql). Creation counts as the
    transition into `pending` (docs/architecture.md). Returns False when the job's idempotency
    key was taken (nothing was written)."""
    ts = timezone.now()
    payload = canonical_bytes(
        audit_payload(
            chain=job_chain(job.id),
            seq=1,
            ts=ts,
            event_type="created",
            actor=actor,
            job_id=job.id,
            data={"from": None, "to": job.status, "attempt": job.attempts},
        )
    )
    job.audit_seq, job.audit_head = 1, chain_hash(GENESIS_HASH, payload)
    event_id = uuid.uuid4()
    params: dict[str, Any] = {
        f"c_{f.column}": f.get_db_prep_save(f.pre_save(job, True), connection)
        for f in Job._meta.concrete_fields
    }
    params.update(
        barrier=CHECKPOINT_BARRIER,
        actor_type=str(actor.type),
        actor_id=actor.id,
        ts=ts,
        payload=payload.decode("utf-8"),
        prev_hash=GENESIS_HASH,
        chain_hash=job.audit_head,
        event_id=event_id,
        event=Jsonb(
            {
                "event_id": str(event_id),
                "type": "job.status.changed",
                "job_id": str(job.id),
                "job_type": job.type,
                "seq": 1,
                "status": job.status,
                "previous_status": None,
                "progress": job.progress_percent,
                "attempt": job.attempts,
                "timestamp": format_ts(ts),
                # So the ERP bridge's log lines follow the request that made the job.
                "request_id": job.request_id,
                "correlation_id": job.correlation_id,
            }
        ),
    )
    return bool(execute_prepared(sql.job_insert_sql(columns=tuple(_JOB_COLUMNS)), params))
