"""The kinds of change of a job (docs/architecture.md#states-and-transitions), each one
SQL function, audited with its event.

Every change of a job is one call of its kind's function (jobs/sql/20_transitions.sql:
claim, progress, succeed, retry, fail, cancel, reclaim, hold, publish, requeue...),
derived from the transition table (jobs.domain.states.ALLOWED): in one statement the
compare-and-set, the change, each job's audit entry continuing its chain and, for a
change of status, its outbox event. Each takes arrays: one call serves one job or a
batch. `KINDS` names them; `change` runs one; the named functions of the services
(jobs.services.worker, .dead_letters, .reaper...) call it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import date, datetime
from functools import partial
from typing import Any

from django.db import connection, transaction
from django.utils import timezone
from psycopg.types.json import Jsonb

from audit.canonical import GENESIS_HASH
from audit.services import Actor, format_ts
from core.db import Rows, execute_prepared, model_from_row
from core.request_id import current_request_id
from jobs.domain.states import ALLOWED, DUE_EVENT, TERMINAL, Status
from jobs.integrations import metrics
from jobs.models import Job
from jobs.queries import QUERIES


@dataclass(frozen=True)
class Fence:
    """A worker's claim: its writes apply only while it still holds this lock and attempt."""

    locked_by: str
    attempt: int


@dataclass(frozen=True)
class Progress:
    """A progress value {percent, step, message, metrics}; its percent written
    monotonically, the rest replacing the row's. `metrics` as jobs.domain.progress
    checked them (None: none)."""

    percent: int
    step: str | None = None
    message: str | None = None
    metrics: dict[str, int | float] | None = None

    @classmethod
    def from_value(cls, value: dict[str, Any] | None) -> Progress | None:
        if not value:
            return None
        percent = max(0, min(100, int(value["percent"])))
        return cls(percent, value.get("step"), value.get("message"), value.get("metrics"))

    def as_value(self) -> dict[str, Any]:
        """As the final transitions take it (`p_progress`): metrics only when there are."""
        value: dict[str, Any] = {
            "percent": self.percent,
            "step": self.step,
            "message": self.message,
        }
        if self.metrics:
            value["metrics"] = self.metrics
        return value


@dataclass(frozen=True)
class Kind:
    """One kind of change: its SQL function (jobs/sql/20_transitions.sql), the status it
    moves a job to (None: none) and from, as the function's compare-and-set says, the
    arguments it takes before the common ones (name, SQL type) and the audit event it
    writes (None: the caller's, its `event_type` argument)."""

    function: str
    target: str | None
    sources: frozenset[str]
    args: tuple[tuple[str, str], ...]
    event: str | None


_FENCED = (("attempts", "int[]"), ("locked_by", "text"))
_ERROR = (("codes", "text[]"), ("messages", "text[]"))
_RUNNING = frozenset({Status.RUNNING})
_UNSTARTED = frozenset({Status.SCHEDULED, Status.PENDING, Status.QUEUED, Status.RETRYING})
_REQUEUE = (("extend", "int"), ("event_type", "text"))
_K = Kind
# Every kind of change, by its function's name. tests/jobs/test_transition_functions.py
# holds each to the transition table (jobs.domain.states.ALLOWED) and to its function.
KINDS: dict[str, Kind] = {
    kind.function: kind
    for kind in (
        _K(
            "jobs_claim_delivered",
            Status.RUNNING,
            frozenset({Status.PENDING, Status.QUEUED, Status.RETRYING}),
            (("locked_by", "text"), ("org_id", "bigint")),
            "started",
        ),
        _K(
            "jobs_claim_polled",
            Status.RUNNING,
            frozenset({Status.PENDING, Status.RETRYING}),
            (("locked_by", "text"),),
            "started",
        ),
        _K(
            "jobs_progress_with_metrics",
            None,
            _RUNNING,
            (
                *_FENCED,
                ("percents", "int[]"),
                ("steps", "text[]"),
                ("messages", "text[]"),
                ("metrics", "jsonb[]"),
            ),
            "progress",
        ),
        _K(
            "jobs_succeed",
            Status.SUCCEEDED,
            _RUNNING,
            (*_FENCED, ("results", "jsonb[]"), ("progress", "jsonb[]")),
            "succeeded",
        ),
        *(
            _K(
                name,
                Status.RETRYING,
                _RUNNING,
                (*_FENCED, ("run_in", "float8[]"), *_ERROR, ("progress", "jsonb[]")),
                "retrying",
            )
            for name in ("jobs_retry", "jobs_retry_held")
        ),
        _K(
            "jobs_cancel_confirm",
            Status.CANCELLED,
            _RUNNING,
            (*_FENCED, ("progress", "jsonb[]")),
            "cancelled",
        ),
        _K(
            "jobs_defer",
            Status.RETRYING,
            _RUNNING,
            (*_FENCED, ("run_in", "float8[]"), *_ERROR),
            "deferred",
        ),
        _K(
            "jobs_fail_fenced",
            Status.FAILED,
            _RUNNING,
            (*_FENCED, ("queues", "text[]"), *_ERROR),
            "failed",
        ),
        _K(
            "jobs_fail_stale",
            Status.FAILED,
            ALLOWED[Status.FAILED],
            (("sources", "text[]"), ("stale_after", "float8"), ("queues", "text[]"), *_ERROR),
            "failed",
        ),
        _K(
            "jobs_fail",
            Status.FAILED,
            ALLOWED[Status.FAILED],
            (("sources", "text[]"), ("queues", "text[]"), *_ERROR),
            "failed",
        ),
        _K("jobs_cancel_request", None, ALLOWED[Status.FAILED], (), "cancel_requested"),
        _K("jobs_cancel", Status.CANCELLED, _UNSTARTED, (), "cancelled"),
        _K(
            "jobs_reclaim",
            Status.RETRYING,
            _RUNNING,
            (("stale_after", "float8"), ("code", "text"), ("message", "text")),
            "reclaimed",
        ),
        _K("jobs_hold", Status.PENDING, frozenset({Status.QUEUED}), (), "held"),
        _K(
            "jobs_mark_queued",
            Status.QUEUED,
            frozenset({Status.PENDING, Status.RETRYING}),
            (("source", "text"),),
            "queued",
        ),
        _K("jobs_promote_due", Status.PENDING, frozenset({Status.SCHEDULED}), (), DUE_EVENT),
        _K("jobs_requeue", Status.PENDING, frozenset({Status.FAILED}), _REQUEUE, None),
        _K(
            "jobs_requeue_with_params",
            Status.PENDING,
            frozenset({Status.FAILED}),
            (("params", "jsonb[]"), ("params_hashes", "text[]"), *_REQUEUE),
            None,
        ),
        _K("jobs_note", None, frozenset(Status.values), (("event_type", "text"),), None),
        # A running job's handler's own entry (annotated: jobs.services.annotations).
        _K("jobs_note_fenced", None, _RUNNING, (*_FENCED, ("event_type", "text")), None),
    )
}
# The arguments every kind takes after its own (jobs/sql/20_transitions.sql).
COMMON_ARGS = (
    ("data", "jsonb[]"),
    ("actor_type", "text"),
    ("actor_id", "text"),
    ("ts", "text"),
    ("request_id", "text"),
)


def _statement(kind: Kind) -> str:
    """The one statement that calls `kind`'s function: its arguments bound by name, with
    their types (psycopg types a list by its values: a list of small ints is int2[]).
    Arrays travel in binary (psycopg's text format escapes each element in Python); a
    jsonb array as text, so that an array of only NULLs needs no element type."""
    args = ", ".join(
        f"%({name}){'s' if sql_type == 'jsonb[]' or not sql_type.endswith('[]') else 'b'}"
        f"::{sql_type}"
        for name, sql_type in (("ids", "uuid[]"), *kind.args, *COMMON_ARGS)
    )
    return (
        "SELECT m.moved_from AS old_status, m.moved_next_run_at AS old_next_run_at, "
        f"(m.moved).* FROM {kind.function}({args}) AS m"
    )


# Built once, from the literal names above: the SQL a reader finds here is what runs.
STATEMENTS = {name: _statement(kind) for name, kind in KINDS.items()}


def change(
    name: str,
    *,
    job_ids: list[uuid.UUID | str],
    actor: Actor,
    data: dict[str, dict[str, Any]] | None = None,
    event_type: str | None = None,
    **args: Any,
) -> Rows:
    """Run the kind of change `name` (KINDS) for `job_ids` in one statement, each job's
    entry with its own `data` (job id -> the entry's data beside what the function adds
    from the row: a change of status's `from`, `to` and `attempt`, and every entry's
    `context`). Returns the changed jobs' rows (old_status, old_next_run_at, then the
    job's columns)."""
    kind = KINDS[name]
    if (kind.event is None) == (event_type is None):
        raise TypeError(f"{name}: the event is {kind.event or 'given by its caller'}")
    if kind.event is None:
        args["event_type"] = event_type
    ts = timezone.now()
    params = {
        **{key: _value(value) for key, value in args.items()},
        "ids": [str(job_id) for job_id in job_ids],
        "data": [Jsonb((data or {}).get(str(job_id)) or {}) for job_id in job_ids],
        "actor_type": str(actor.type),
        "actor_id": actor.id,
        "ts": format_ts(ts),
        "request_id": current_request_id(),
    }
    if set(params) != {n for n, _ in (("ids", ""), *kind.args, *COMMON_ARGS)}:
        raise TypeError(f"{name} takes {[n for n, _ in kind.args]}, not {sorted(args)}")
    return execute_prepared(STATEMENTS[name], params)


def _value(value: Any) -> Any:
    """A jsonb argument's elements as JSON (None stays NULL)."""
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        return [None if v is None else Jsonb(v) for v in value]
    return value


def moved(
    name: str,
    rows: Rows,
    *,
    flushed: frozenset[str] = frozenset(),
    claim: bool = False,
    retried: bool = True,
) -> list[Job]:
    """The jobs of a change's rows, each counted once its transaction commits
    (_count_transition): `flushed`, the ids of the jobs whose last progress value the
    change flushed; `claim`, a claim (its queue latency); `retried` false, a retry that
    counts none (a deferral)."""
    kind = KINDS[name]
    jobs = [model_from_row(Job, row, rows.columns) for row in rows]
    next_run_at = rows.columns.index("old_next_run_at")
    for job, row in zip(jobs, rows, strict=True):
        if kind.target is not None:
            due = _claim_due(job, row[next_run_at]) if claim else None
            _count_transition(
                job,
                kind.target,
                writes_progress=str(job.id) in flushed,
                due=due,
                retried=retried,
            )
    return jobs


def _claim_due(job: Job, old_next_run_at: datetime | None) -> datetime | None:
    """When the job claimed now became due to run: a retry's next_run_at (kept while
    the dispatcher republishes it), else its creation (or its run_at, when scheduled
    later). None for a later attempt that was no retry (a replay, an owner's retry,
    which clear next_run_at): when it became pending again is not on the row, and its
    creation would count the time it spent failed as queueing."""
    if old_next_run_at is not None:
        return old_next_run_at
    if job.attempts == 1:
        return max(job.created_at, job.run_at or job.created_at)
    return None


_LABELLED = TERMINAL | {Status.RUNNING}


def _count_transition(
    job: Job,
    target: str,
    *,
    writes_progress: bool,
    due: datetime | None = None,
    retried: bool = True,
) -> None:
    """Prometheus counters of a status change, incremented once its transaction commits.

    A claim (`due`: when the job became due) observes its queue latency; a job's end
    counts its outcome and observes how many attempts it took; a deferral
    (`retried` false) counts no retry."""
    if writes_progress:  # a final transition flushing the last coalesced progress value
        transaction.on_commit(metrics.PROGRESS_UPDATE.inc)
    # Only a start and an end carry the job_type and queue labels (not the publisher's
    # transitions, a batch at a time).
    labels = metrics.jobs_labels(job.type) if target in _LABELLED else {}
    if target == Status.RUNNING:
        transaction.on_commit(metrics.JOBS_STARTED.labels(**labels).inc)
    if due is not None and job.locked_at is not None:
        latency = metrics.JOB_QUEUE_LATENCY.labels(type=job.type)
        waited = max(0.0, (job.locked_at - due).total_seconds())
        transaction.on_commit(lambda: latency.observe(waited))
    if target in TERMINAL:
        finished = metrics.JOB_FINISHED.labels(
            type=job.type, status=str(target), **metrics.org_label(job.org_id)
        )
        transaction.on_commit(finished.inc)
        for histogram in (
            metrics.JOB_ATTEMPTS.labels(type=job.type),
            metrics.JOBS_ATTEMPTS.labels(**labels),
        ):
            transaction.on_commit(partial(histogram.observe, job.attempts))
    # A failure is counted with its dead letter, which says its class
    # (jobs.services.dead_letters._count_dead_lettered).
    if target == Status.SUCCEEDED:
        transaction.on_commit(metrics.JOBS_SUCCEEDED.labels(type=job.type, **labels).inc)
    elif target == Status.CANCELLED:
        transaction.on_commit(metrics.CANCELLATION.inc)
    elif target == Status.RETRYING and retried:
        counter = metrics.RETRIES.labels(
            type=job.type, error_code=metrics.error_code_label(job.last_error_code)
        )
        transaction.on_commit(counter.inc)


def job_audit(
    *,
    job_id: uuid.UUID | str,
    event_type: str,
    actor: Actor,
    data: dict[str, Any] | None = None,
) -> None:
    """Audit an event that changes no status and nothing else of the job
    (dead_lettered, dlq_discarded) on the job's chain, in one statement."""
    jobs_audit(entries={job_id: data or {}}, event_type=event_type, actor=actor)


def jobs_audit(*, entries: dict[Any, dict[str, Any]], event_type: str, actor: Actor) -> int:
    """`job_audit` for many jobs in one statement (entries: job id -> the entry's data),
    for an operator's bulk action; returns how many entries were appended."""
    if not entries:
        return 0
    rows = change(
        "jobs_note",
        job_ids=list(entries),
        actor=actor,
        event_type=event_type,
        data={str(job_id): data for job_id, data in entries.items()},
    )
    return len(rows)


def job_progress_audit(
    *, job_id: uuid.UUID | str, fence: Fence, progress: Progress, actor: Actor
) -> bool:
    """Write a progress value while `fence` holds, monotonically, moving the version,
    with its `progress` entry (which records the percent the row holds after the
    write; its metrics go on the row only), in one statement. False when the fence no
    longer holds (nothing written)."""
    rows = change(
        "jobs_progress_with_metrics",
        job_ids=[job_id],
        actor=actor,
        attempts=[fence.attempt],
        locked_by=fence.locked_by,
        percents=[progress.percent],
        steps=[progress.step],
        messages=[progress.message],
        metrics=[progress.metrics],
    )
    return bool(rows)


def job_cancel_request(*, job_id: uuid.UUID | str, actor: Actor) -> bool:
    """Raise a job's cancel flag with its `cancel_requested` entry, in one statement;
    False (nothing written) when it was raised already or the job has ended."""
    return bool(change("jobs_cancel_request", job_ids=[job_id], actor=actor))


def jobs_requeue(
    *,
    job_ids: list[uuid.UUID | str],
    extend: int,
    event_type: str,
    actor: Actor,
    data: dict[str, dict[str, Any]] | None = None,
) -> list[Job]:
    """Put ended jobs back in line (jobs_requeue): `failed` -> `pending` with `extend`
    more attempts, audited `event_type` with each job's `data` (job id -> its entry's
    data); returns the jobs moved (one no longer failed is not among them)."""
    rows = change(
        "jobs_requeue",
        job_ids=job_ids,
        actor=actor,
        event_type=event_type,
        data=data,
        extend=int(extend),
    )
    return moved("jobs_requeue", rows)


def job_requeue_with_params(
    *,
    job_id: uuid.UUID | str,
    params: dict[str, Any],
    params_hash: str,
    extend: int,
    event_type: str,
    actor: Actor,
    data: dict[str, Any],
) -> Job | None:
    """jobs_requeue with the job's params replaced (an operator's fix-forward); None when
    the job is no longer failed."""
    rows = change(
        "jobs_requeue_with_params",
        job_ids=[job_id],
        actor=actor,
        event_type=event_type,
        data={str(job_id): data},
        params=[params],
        params_hashes=[params_hash],
        extend=int(extend),
    )
    requeued = moved("jobs_requeue_with_params", rows)
    return requeued[0] if requeued else None


def job_insert(job: Job, *, actor: Actor) -> bool:
    """Insert a new `pending` (or `scheduled`) job with its `created` entry and event, and wake the
    dispatcher, in one statement (job_insert, jobs/queries.sql). Creation counts as the
    transition into `pending` (docs/architecture.md). Returns False when the job's
    idempotency key was taken (nothing was written)."""
    ts = timezone.now()
    job.audit_seq = 1
    params: dict[str, Any] = {
        f.column: f.get_db_prep_save(f.pre_save(job, True), connection)
        for f in Job._meta.concrete_fields
    }
    params.update(
        actor_type=str(actor.type),
        actor_id=actor.id,
        ts=ts,
        ts_text=format_ts(ts),
        prev_hash=GENESIS_HASH,
        event_id=uuid.uuid4(),
        entry_request_id=current_request_id(),
        # A re-run's first entry names the job it re-runs (only then: the entries of
        # every other job stay as they were).
        entry=Jsonb({"rerun_of": str(job.rerun_of_id)} if job.rerun_of_id else {}),
    )
    rows = execute_prepared(QUERIES["job_insert"], params)
    if not rows:
        return False
    job.audit_seq, job.audit_head = 1, rows[0][1]
    return True


def jobs_insert(jobs: list[Job], *, actor: Actor) -> set[uuid.UUID]:
    """job_insert for a batch of new jobs (a batch create, jobs.services.batch_creation):
    one jobs_insert_batch statement (jobs/queries.sql), each job with its `created`
    entry and event, one NOTIFY. Returns the ids inserted (a job whose idempotency key
    was taken is not). The rows go keyed first, by (organisation, key): concurrent
    batches sharing keys take the key index's locks in one order, and never deadlock
    on each other."""
    ts = timezone.now()
    rows = []
    for job in jobs:
        row = {f.column: f.pre_save(job, True) for f in Job._meta.concrete_fields}
        row["audit_seq"] = 1
        rows.append(row)
    rows.sort(key=lambda r: (r["idempotency_key"] is None, r["org_id"], r["idempotency_key"] or ""))
    params = {
        "rows": json.dumps(rows, default=_json_value),
        "actor_type": str(actor.type),
        "actor_id": actor.id,
        "ts": ts,
        "ts_text": format_ts(ts),
        "prev_hash": GENESIS_HASH,
        "entry_request_id": current_request_id(),
    }
    inserted = {row[0] for row in execute_prepared(QUERIES["jobs_insert_batch"], params)}
    for job in jobs:
        if job.id in inserted:
            job.audit_seq = 1
    return inserted


def _json_value(value: Any) -> Any:
    # The row's values as PostgreSQL reads them back (jsonb_populate_recordset): full
    # precision timestamps with their offset, ids as text.
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"not a column value: {type(value).__name__}")
