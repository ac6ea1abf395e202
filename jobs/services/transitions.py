"""The one compare-and-set transition of docs/architecture.md, audited with its event.

Every status change of a job goes through `transition`: one conditional UPDATE, then in
the same statement the audit entry and the outbox event. Callers say what the
transition does with named options, each a parameter of the one literal statement
`job_append` (jobs/queries.sql); the events that change no status (progress, a cancel
request, an operator's note) run the same statement with other parameters.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypedDict, Unpack

from django.db import connection, transaction
from django.utils import timezone
from psycopg.types.json import Jsonb

from audit.canonical import (
    GENESIS_HASH,
    Hole,
    Template,
    canonical_bytes,
    canonical_template,
    chain_hash,
)
from audit.services import Actor, audit_payload, format_ts, job_chain
from core.db import Rows, execute_prepared, model_from_row
from core.request_id import current_request_id
from jobs import metrics
from jobs.exceptions import JobLost, TransitionRefusedError
from jobs.models import Job
from jobs.queries import HOLE, QUERIES
from jobs.states import ALLOWED, EVENT_FOR_STATUS, TERMINAL, Status

# Holes an entry may have: job_append fills up to four (jobs/queries.sql).
MAX_HOLES = 4
# Distinct entry data a batch keeps a template of (`_append`): a batch of one outcome
# has one or a few (retries each carry their own error code and delay).
SHARED_TEMPLATES = 8
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
        # a fix-forward replays a job with edited params (dlq.services.fix_forward)
        "params",
        "params_hash",
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


# What a job of a batch transition may have of its own (`Each.fields`): job_append's
# `each` (jobs/queries.sql) applies these in place of the statement's one value.
EACH_FIELDS = frozenset({"result", "last_error_code", "last_error_message"})


@dataclass(frozen=True)
class Each:
    """One job's own values in `transition_each`: the attempt its fence holds (with the
    batch's lock holder), its retry delay, its last progress value, its `fields`
    (EACH_FIELDS) and its audit entry's data."""

    job_id: uuid.UUID | str
    attempt: int | None = None
    run_in: float | None = None
    progress: Progress | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    audit_data: dict[str, Any] | None = None

    def values(self) -> str:
        """The JSON text of job_append's `each` element for this job."""
        unknown = set(self.fields) - EACH_FIELDS
        if unknown:
            raise ValueError(f"a batch transition cannot set {sorted(unknown)} per job")
        values: dict[str, Any] = dict(self.fields)
        if self.attempt is not None:
            values["attempt"] = int(self.attempt)
        if self.run_in is not None:
            values["run_in"] = float(self.run_in)
        if self.progress is not None:
            values.update(
                percent=self.progress.percent,
                progress_step=self.progress.step,
                progress_message=self.progress.message,
            )
        return json.dumps(values, allow_nan=False)


class TransitionOptions(TypedDict, total=False):
    """What a transition does besides the status (each a parameter of job_append).

    - `sources`: the states it may leave (default: every state jobs.states allows);
    - `fence`: only while this worker still holds the lock and attempt (else JobLost);
    - `claim_for`: take the lock for this holder, count an attempt; a retrying job only
      when it is due;
    - `stale_after`: only while the lock is older than this many seconds (the reaper);
    - `org_id`: only a job of this organisation (the claim checks a message's tenant);
    - `org_active`: only while the job's organisation is not suspended (the claim);
    - `queue_active`: only while the job's queue is not paused (the claim);
    - `run_in`: `next_run_at = now() + run_in` seconds;
    - `progress`: a last progress value (monotonic); `complete`: progress 100 %;
    - `extend_attempts`: `max_attempts` grows by this many (a replay's fresh budget);
    - `give_back`: the attempt the claim counted is taken back (a run deferred before
      its handler started: jobs.services.connectors);
    - `fields`: plain column values (SETTABLE_FIELDS);
    - `event_type`: the audit event, when not the target state's own (`reclaimed`...);
    - `notify`: NOTIFY jobs_pending or not (default: for a job back in `pending`, and a
      claim, which frees a place in its queue's broker window).
    Leaving `running` always releases the lock (only a running job holds one).
    """

    sources: Iterable[str] | None
    fence: Fence | None
    claim_for: str | None
    stale_after: float | None
    org_id: int | None
    org_active: bool
    queue_active: bool
    run_in: float | None
    progress: Progress | None
    complete: bool
    extend_attempts: int | None
    give_back: bool
    fields: dict[str, Any] | None
    event_type: str | None
    notify: bool


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
    2. One statement (job_append, jobs/queries.sql): the conditional UPDATE, the audit entry
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


def transition_each(
    *,
    each: list[Each],
    target: str,
    actor: Actor,
    locked_by: str | None = None,
    **options: Unpack[TransitionOptions],
) -> list[Job]:
    """`transition_many` where each job has values of its own (`Each`), in one
    statement: the postgres executor's window of finished jobs of one outcome. With
    `locked_by`, each job's write is fenced by that holder and the job's own
    `Each.attempt`; a job whose fence failed (reclaimed meanwhile) is simply not among
    the jobs returned, and the others are unaffected."""
    if not each:
        return []
    by_id = {str(e.job_id): e for e in each}
    return transition_many(
        job_ids=[e.job_id for e in each],
        target=target,
        actor=actor,
        audit_data={k: e.audit_data for k, e in by_id.items() if e.audit_data},
        _each=by_id,
        _holder=locked_by,
        **options,
    )


def transition_many(
    *,
    job_ids: list[uuid.UUID | str],
    target: str,
    actor: Actor,
    audit_data: dict[str, dict[str, Any]] | None = None,
    _each: dict[str, Each] | None = None,
    _holder: str | None = None,
    **options: Unpack[TransitionOptions],
) -> list[Job]:
    """`transition` for many jobs in one statement (the dispatcher's publish batch, a
    replay chunk); `audit_data` is per job id. Returns the jobs that moved: a job the
    compare-and-set refused is simply not among them. (`_each`, `_holder`:
    transition_each's per-job values and fence holder.)"""
    sources = options.get("sources")
    fence, claim_for = options.get("fence"), options.get("claim_for")
    progress, complete = options.get("progress"), options.get("complete", False)
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
    fields = dict(options.get("fields") or {})
    unknown = set(fields) - SETTABLE_FIELDS
    if unknown:
        raise ValueError(f"transition cannot set {sorted(unknown)}")
    if progress is not None:  # the step and message of the last progress value
        fields.update(progress_step=progress.step, progress_message=progress.message)
    # `complete` writes 100 % (with the last value's step and message, if any).
    percent = 100 if complete else progress.percent if progress is not None else None
    entries = {
        job_id: {"from": Hole("from", "text"), "to": target, "attempt": Hole("attempt")}
        | ((audit_data or {}).get(str(job_id)) or {})
        for job_id in job_ids
    }
    rows = _append(
        entries=entries,
        event_type=options.get("event_type") or EVENT_FOR_STATUS[target],
        actor=actor,
        each={k: e.values() for k, e in (_each or {}).items()},
        change=_Change(
            target=target,
            sources=sorted(source_set),
            fence=fence,
            holder=_holder,
            claim_for=claim_for,
            stale_after=options.get("stale_after"),
            org_id=options.get("org_id"),
            org_active=options.get("org_active", False),
            queue_active=options.get("queue_active", False),
            run_in=options.get("run_in"),
            percent=percent,
            extend_attempts=options.get("extend_attempts") or 0,
            give_back=options.get("give_back", False),
            fields=fields,
            bump=True,
            emit=True,
            # A job back in `pending` (a replay) waits for the dispatcher: wake it. So
            # does a claim: it frees a place in its queue's broker window, which the
            # dispatcher refills from the pending backlog at once (due_pending_jobs).
            notify=options.get("notify", target == Status.PENDING or claim_for is not None),
        ),
    )
    jobs = [model_from_row(Job, row, rows.columns) for row in rows]
    next_run_at = rows.columns.index("old_next_run_at")
    for job, row in zip(jobs, rows, strict=True):
        own = (_each or {}).get(str(job.id))
        writes = progress is not None or (own is not None and own.progress is not None)
        due = _claim_due(job, row[next_run_at]) if claim_for else None
        _count_transition(
            job,
            target,
            writes_progress=writes,
            due=due,
            # a deferral is no retry: the handler did not run (jobs.services.connectors)
            retried=not options.get("give_back", False),
        )
    return jobs


@dataclass(frozen=True)
class _Change:
    """What one job_append statement (jobs/queries.sql) does besides appending each
    job's entry; every field is one of its parameters, whose description says what it
    does (None, False, 0 or empty: that part does nothing)."""

    target: str | None = None
    sources: list[str] | None = None
    fence: Fence | None = None
    holder: str | None = None  # a fence whose attempt is each job's own (`each`)
    claim_for: str | None = None
    stale_after: float | None = None
    org_id: int | None = None
    org_active: bool = False
    queue_active: bool = False
    run_in: float | None = None
    percent: int | None = None
    extend_attempts: int = 0
    give_back: bool = False
    fields: dict[str, Any] = field(default_factory=dict)
    cancel_request: bool = False
    bump: bool = False
    emit: bool = False
    notify: bool = False

    def params(self) -> dict[str, Any]:
        fence = self.fence
        params: dict[str, Any] = {
            "target": self.target,
            "sources": self.sources,
            "locked_by": fence.locked_by if fence else self.holder,
            "attempt": fence.attempt if fence else None,
            "claim_for": self.claim_for,
            "stale_after": None if self.stale_after is None else float(self.stale_after),
            "org_id": self.org_id,
            "org_active": self.org_active,
            "queue_active": self.queue_active,
            "run_in": None if self.run_in is None else float(self.run_in),
            "percent": self.percent,
            "extend_attempts": int(self.extend_attempts),
            "give_back": self.give_back,
            "cancel_request": self.cancel_request,
            "bump": self.bump,
            "emit": self.emit,
            "notify": self.notify,
        }
        for column in SETTABLE_FIELDS:
            value = self.fields.get(column)
            params[f"set_{column}"] = column in self.fields
            params[column] = Jsonb(value) if isinstance(value, dict | list) else value
        return params


def _append(
    *,
    entries: dict[Any, dict[str, Any]],
    event_type: str,
    actor: Actor,
    change: _Change,
    each: dict[str, str] | None = None,
) -> Rows:
    """Run job_append (jobs/queries.sql) for `entries` (job id -> the entry's data, with
    its Holes): one canonical template per job, cut where the database fills in.

    Every entry of a job says which attempt it belongs to and carries the job's
    `context` (docs/tenancy.md#audit: organisation, project, type, correlation id and
    the request that made the change), both filled from the locked row."""
    ts = timezone.now()
    entries = {
        job_id: {"attempt": Hole("attempt"), **data, "context": Hole("context", "json")}
        for job_id, data in entries.items()
    }
    # The entries of a batch (a claim, a window of ends) mostly differ in their job's id
    # alone: one canonical template per distinct `data`, made for a stand-in id (a
    # random nonce, so no value can contain it) that each job's id then replaces. The
    # same bytes as a template per job, without encoding each entry again.
    stand_in = f"<job:{secrets.token_hex(8)}>"
    made: list[tuple[dict[str, Any], Template]] = []
    templates: dict[Any, Template] = {}
    for job_id, data in entries.items():
        template = next((t for known, t in made if known == data), None)
        if template is None:
            template = canonical_template(
                audit_payload(
                    chain=job_chain(stand_in),
                    seq=Hole("seq"),
                    ts=ts,
                    event_type=event_type,
                    actor=actor,
                    job_id=stand_in,
                    data=data,
                )
            )
            if len(made) < SHARED_TEMPLATES:
                made.append((data, template))
        templates[job_id] = template.replace(stand_in, str(job_id))
    holes = [h.name for h in next(iter(templates.values())).holes]
    if any([h.name for h in t.holes] != holes for t in templates.values()):
        raise ValueError("one statement appends entries with the same holes only")
    if len(holes) > MAX_HOLES:
        raise ValueError(f"an entry has at most {MAX_HOLES} holes, not {holes}")
    padding = [""] * (MAX_HOLES - len(holes))
    pieces = [[*t.pieces, *padding] for t in templates.values()]
    filled = [HOLE[name] for name in holes] + [None] * len(padding)
    params = {
        **change.params(),
        "ids": [str(job_id) for job_id in templates],
        "each": [(each or {}).get(str(job_id)) for job_id in templates],
        **{f"p{n}": [p[n] for p in pieces] for n in range(MAX_HOLES + 1)},
        **{f"h{n}": hole for n, hole in enumerate(filled)},
        "event_type": event_type,
        "actor_type": str(actor.type),
        "actor_id": actor.id,
        "ts": ts,
        "ts_text": format_ts(ts),
        "request_id": current_request_id(),
    }
    return execute_prepared(QUERIES["job_append"], params)


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
    if due is not None and job.locked_at is not None:
        latency = metrics.JOB_QUEUE_LATENCY.labels(type=job.type)
        waited = max(0.0, (job.locked_at - due).total_seconds())
        transaction.on_commit(lambda: latency.observe(waited))
    if target in TERMINAL:
        finished = metrics.JOB_FINISHED.labels(
            type=job.type, status=str(target), **metrics.org_label(job.org_id)
        )
        transaction.on_commit(finished.inc)
        attempts = metrics.JOB_ATTEMPTS.labels(type=job.type)
        transaction.on_commit(lambda: attempts.observe(job.attempts))
    if target == Status.SUCCEEDED:
        transaction.on_commit(metrics.JOBS_SUCCEEDED.labels(type=job.type).inc)
    elif target == Status.FAILED:
        failed = metrics.JOBS_FAILED.labels(
            type=job.type, error_code=metrics.error_code_label(job.last_error_code)
        )
        transaction.on_commit(failed.inc)
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
    _append(entries={job_id: data or {}}, event_type=event_type, actor=actor, change=_Change())


def jobs_audit(*, entries: dict[Any, dict[str, Any]], event_type: str, actor: Actor) -> int:
    """`job_audit` for many jobs in one statement (entries: job id -> the entry's data),
    for an operator's bulk action; returns how many entries were appended."""
    if not entries:
        return 0
    return len(_append(entries=entries, event_type=event_type, actor=actor, change=_Change()))


def job_progress_audit(
    *, job_id: uuid.UUID | str, fence: Fence, progress: Progress, actor: Actor
) -> bool:
    """Write a progress value while `fence` holds, monotonically, moving the version,
    with its `progress` entry (which records the percent the row holds after the
    write), in one statement. False when the fence no longer holds (nothing written)."""
    return bool(
        _append(
            entries={
                job_id: {
                    "percent": Hole("percent"),
                    "step": progress.step,
                    "attempt": fence.attempt,
                }
            },
            event_type="progress",
            actor=actor,
            change=_Change(
                fence=fence,
                percent=progress.percent,
                fields={"progress_step": progress.step, "progress_message": progress.message},
                bump=True,
            ),
        )
    )


def job_cancel_request(*, job_id: uuid.UUID | str, actor: Actor) -> bool:
    """Raise a job's cancel flag with its `cancel_requested` entry, in one statement;
    False (nothing written) when it was raised already or the job has ended."""
    return bool(
        _append(
            entries={job_id: {}},
            event_type="cancel_requested",
            actor=actor,
            change=_Change(cancel_request=True, bump=True),
        )
    )


def audit_context(job: Job, *, request_id: str | None) -> dict[str, Any]:
    """The `context` of a job's audit entry, as jobs_audit_context (jobs/migrations/0014)
    writes it in SQL for every entry after the first."""
    return {
        "correlation_id": job.correlation_id,
        "job_type": job.type,
        "org_id": job.org_id,
        "project_id": job.project_id,
        "request_id": request_id,
    }


def job_insert(job: Job, *, actor: Actor) -> bool:
    """Insert a new `pending` (or `scheduled`) job with its `created` entry and event, and wake the
    dispatcher, in one statement (job_insert, jobs/queries.sql). Creation counts as the
    transition into `pending` (docs/architecture.md). Returns False when the job's
    idempotency key was taken (nothing was written)."""
    ts = timezone.now()
    payload = canonical_bytes(
        audit_payload(
            chain=job_chain(job.id),
            seq=1,
            ts=ts,
            event_type="created",
            actor=actor,
            job_id=job.id,
            data={
                "from": None,
                "to": job.status,
                "attempt": job.attempts,
                "context": audit_context(job, request_id=current_request_id()),
                # A re-run's first entry names the job it re-runs (only then: the
                # entries of every other job stay as they were).
                **({"rerun_of": str(job.rerun_of_id)} if job.rerun_of_id else {}),
            },
        )
    )
    job.audit_seq, job.audit_head = 1, chain_hash(GENESIS_HASH, payload)
    params: dict[str, Any] = {
        f.column: f.get_db_prep_save(f.pre_save(job, True), connection)
        for f in Job._meta.concrete_fields
    }
    params.update(
        actor_type=str(actor.type),
        actor_id=actor.id,
        ts=ts,
        ts_text=format_ts(ts),
        payload=payload.decode("utf-8"),
        prev_hash=GENESIS_HASH,
        event_id=uuid.uuid4(),
    )
    return bool(execute_prepared(QUERIES["job_insert"], params))
