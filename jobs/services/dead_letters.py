"""A job that fails for good, with its dead letter (docs/architecture.md#dead-letters).

Failing is part of a job's life: the worker (an error it cannot retry), the reaper (a
worker lost on the last attempt), the dispatcher (a type that no longer exists) and
the dead-letter watcher (a message the broker gave up on) all end a job here. The
operator tooling around dead letters (replay, discard, peek) is the `dlq` app.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.services import Actor
from jobs.domain.errors import failure_class
from jobs.domain.exceptions import JobLost, TransitionRefusedError
from jobs.domain.states import ALLOWED, Status
from jobs.integrations import metrics
from jobs.integrations.topology import dlq_name
from jobs.models import DeadLetter, DeadLetterState, Job, ParamsEdit, ParamsEditState
from jobs.services.transitions import Fence, Progress, change, jobs_audit, moved

# What a writer reads of a locked dead letter: never the stored headers and x-death,
# which no decision needs and which can be large.
ROW_FIELDS = ("id", "job_id", "reason", "queue", "message_id", "broker_copy")


@dataclass(frozen=True)
class Locked:
    """The rows a writer holds: its jobs by id, then the open dead letters it asked for."""

    jobs: dict[uuid.UUID, Job]
    open_rows: list[DeadLetter]


def lock_jobs_then_open_rows(
    *,
    job_ids: Iterable[uuid.UUID | None],
    job_fields: Sequence[str] = ("id",),
    dead_letter_ids: Iterable[int] | None = None,
    of_jobs: bool = False,
) -> Locked:
    """The lock order of every dead-letter writer: the jobs, then their dead letters.

    A job and its dead letter change together (a job fails with its row; a replay, a
    retry or a fix-forward moves the job and closes the row), so every writer takes the
    job rows first and the dead-letter rows second, each in id order: two writers then
    wait for one another instead of deadlocking (docs/architecture.md#dead-letters). A
    job failing with its dead letter locks its job by the transition's compare-and-set
    before the insert; every other writer locks through here.

    Locks `job_ids` (their `job_fields` loaded; None ids are skipped), then the open
    dead letters among `dead_letter_ids`, or with `of_jobs` the open rows of those
    jobs; neither: the jobs alone. The caller holds the transaction."""
    wanted = [job_id for job_id in job_ids if job_id is not None]
    jobs = {
        job.id: job
        for job in Job.objects.select_for_update()
        .filter(id__in=wanted)
        .order_by("id")
        .only(*job_fields)
    }
    rows = DeadLetter.objects.select_for_update().filter(state=DeadLetterState.OPEN)
    if dead_letter_ids is not None:
        rows = rows.filter(id__in=list(dead_letter_ids))
    elif of_jobs:
        rows = rows.filter(job_id__in=list(jobs))
    else:
        return Locked(jobs=jobs, open_rows=[])
    return Locked(jobs=jobs, open_rows=list(rows.order_by("id").only(*ROW_FIELDS)))


@dataclass(frozen=True)
class BrokerCopy:
    """The broker message a dead letter records (the dead-letter watcher saw it): its
    RabbitMQ `x-death`, its headers, and its identity, the watcher's idempotency key."""

    x_death: Any = None
    headers: Any = None
    message_id: str | None = None


@dataclass(frozen=True)
class NewDeadLetter:
    """One dead letter to record: its job (None for a message that names no job), its
    DLQ `queue`, why it died, and the broker's copy once the watcher has seen it."""

    job_id: uuid.UUID | None
    queue: str
    reason: str
    error_code: str | None = None
    error_message: str | None = None
    broker_copy: BrokerCopy | None = None
    body: str | None = None  # the raw message, kept only when it names no job
    # A row recorded already discarded, with this justification: a broker copy that
    # needs no action (the watcher's copy of a job whose own run decides its outcome).
    discarded_with: str | None = None


def dead_letters_create(records: Iterable[NewDeadLetter]) -> list[DeadLetter]:
    """Insert dead-letter rows, in one statement: the one place a row is created (a job
    failing for good, and the watcher's rows of messages it can only record).

    The caller holds the transaction; the partial unique indexes keep one open row per
    job and one row per broker message.
    """
    now = timezone.now()
    return DeadLetter.objects.bulk_create(_row(record, now) for record in records)


def _row(record: NewDeadLetter, now: datetime.datetime) -> DeadLetter:
    copy, discarded = record.broker_copy or BrokerCopy(), record.discarded_with
    return DeadLetter(
        job_id=record.job_id,
        queue=record.queue,
        reason=record.reason,
        error_code=record.error_code,
        error_message=record.error_message,
        broker_copy=record.broker_copy is not None,
        x_death=copy.x_death,
        headers=copy.headers,
        message_id=copy.message_id,
        body=record.body,
        state=DeadLetterState.OPEN if discarded is None else DeadLetterState.DISCARDED,
        resolved_at=None if discarded is None else now,
        justification=discarded,
    )


def job_fail_with_dead_letter(
    *,
    job_id: uuid.UUID | str,
    reason: str,
    actor: Actor,
    error_code: str | None = None,
    error_message: str | None = None,
    fence: Fence | None = None,
    sources: Iterable[str] | None = None,
    stale_after: float | None = None,
    broker_copy: BrokerCopy | None = None,
) -> tuple[Job, DeadLetter]:
    """Move a job to `failed` and open its dead letter, in one transaction.

    1. The compare-and-set transition to `failed` (fenced for a worker; `stale_after`
       for the reaper and the watcher: only while the lock is stale); raises JobLost /
       TransitionRefusedError.
    2. The `dead_letters` row for the job's DLQ; the partial unique index keeps it to
       one open row per job.
    The caller rejects the broker message (requeue=False) only after this commits.
    """
    with transaction.atomic():
        # The queue is needed before the UPDATE to set dead_letter_queue in the same write.
        queue = dlq_name(Job.objects.values_list("queue", flat=True).get(id=job_id))
        failed = _fail(
            job_ids=[job_id],
            actor=actor,
            entry=_failed_entry(reason, error_code),
            queue=queue,
            error=(error_code, error_message),
            fence=fence,
            sources=list(sources or [Status.RUNNING]),
            stale_after=stale_after,
        )
        if not failed:
            if fence is not None:
                raise JobLost(f"job {job_id}: lock {fence.locked_by} attempt {fence.attempt} lost")
            current = Job.objects.filter(id=job_id).values_list("status", flat=True).first()
            raise TransitionRefusedError(job_id=job_id, current=current, target=Status.FAILED)
        job = failed[0]
        record = NewDeadLetter(job.id, queue, reason, error_code, error_message, broker_copy)
        [dead_letter] = dead_letters_create([record])
        _count_dead_lettered([job], reason)
    return job, dead_letter


def jobs_fail_with_dead_letters(
    *,
    job_ids: list[uuid.UUID],
    source: str,
    queue: str,
    reason: str,
    actor: Actor,
    error_code: str | None,
    error_message: str | None,
    broker_copies: dict[uuid.UUID, BrokerCopy],
) -> list[DeadLetter]:
    """`job_fail_with_dead_letter` for many jobs of one DLQ `queue` that fail from
    `source` for the same reason, in one transition statement and one insert (the
    dead-letter watcher's burst of broker-made dead letters). `broker_copies` holds
    each job's broker copy. A job no longer in `source` is left as it is; returns the
    rows opened. The caller holds the transaction.
    """
    failed = _fail(
        job_ids=list(job_ids),
        actor=actor,
        entry=_failed_entry(reason, error_code),
        queue=queue,
        error=(error_code, error_message),
        sources=[source],
    )
    rows = dead_letters_create(
        NewDeadLetter(job.id, queue, reason, error_code, error_message, broker_copies[job.id])
        for job in failed
    )
    _count_dead_lettered(failed, reason)
    return rows


@dataclass(frozen=True)
class FencedFailure:
    """A run that fails its job for good (the completer's): its job and attempt, why
    (the dead letter's reason), the error, and the last progress value to write first."""

    job_id: uuid.UUID | str
    attempt: int
    reason: str
    error_code: str | None
    error_message: str | None
    progress: dict[str, Any] | None = None
    # The provider that ran it (a connector with providers): its entry names it.
    provider: str | None = None


def jobs_fail_fenced_with_dead_letters(
    *, locked_by: str, failures: list[FencedFailure], actor: Actor
) -> list[Job]:
    """`job_fail_with_dead_letter` of a batch of runs of the lock holder `locked_by`,
    each fenced by its own attempt: each failure's last progress value is written first
    (one jobs_progress_with_metrics for those that carry one: its `progress` entry), then one
    jobs_fail_fenced fails them all into their queues' DLQs, each with its error and
    entry, and one insert opens their dead letters (no broker copy: the database row
    is the dead letter; a Celery delivery rejects its message after the commit, and the
    watcher records the broker's copy on this row). A job whose fence failed is left as
    it is; returns the jobs failed. In one transaction (the caller's, if it holds one)."""
    if not failures:
        return []
    with transaction.atomic(savepoint=False):
        values = [(f, Progress.from_value(f.progress)) for f in failures]
        flushed = [(f, p) for f, p in values if p is not None]
        if flushed:
            rows = change(
                "jobs_progress_with_metrics",
                job_ids=[f.job_id for f, _ in flushed],
                actor=actor,
                attempts=[f.attempt for f, _ in flushed],
                locked_by=locked_by,
                percents=[p.percent for _, p in flushed],
                steps=[p.step for _, p in flushed],
                messages=[p.message for _, p in flushed],
                metrics=[p.metrics for _, p in flushed],
            )
            for _ in rows:
                transaction.on_commit(metrics.PROGRESS_UPDATE.inc)
        ids = [f.job_id for f in failures]
        queues = {
            job_id: dlq_name(queue)
            for job_id, queue in Job.objects.filter(id__in=ids).values_list("id", "queue")
        }
        by_id = {str(f.job_id): f for f in failures}
        rows = change(
            "jobs_fail_fenced",
            job_ids=ids,
            actor=actor,
            attempts=[f.attempt for f in failures],
            locked_by=locked_by,
            queues=[queues.get(uuid.UUID(str(job_id)), "") for job_id in ids],
            codes=[f.error_code for f in failures],
            messages=[f.error_message for f in failures],
            data={
                key: _failed_entry(f.reason, f.error_code)
                | ({"provider": f.provider} if f.provider else {})
                for key, f in by_id.items()
            },
        )
        failed = {str(job.id): job for job in moved("jobs_fail_fenced", rows)}
        done = [failed[str(f.job_id)] for f in failures if str(f.job_id) in failed]
        dead_letters_create(
            NewDeadLetter(
                job.id,
                queues[job.id],
                by_id[str(job.id)].reason,
                by_id[str(job.id)].error_code,
                by_id[str(job.id)].error_message,
            )
            for job in done
        )
        for job in done:
            _count_dead_lettered([job], by_id[str(job.id)].reason)
    return done


def _fail(
    *,
    job_ids: list[uuid.UUID | str],
    actor: Actor,
    entry: dict[str, Any],
    queue: str,
    error: tuple[str | None, str | None],
    sources: list[str],
    fence: Fence | None = None,
    stale_after: float | None = None,
) -> list[Job]:
    """Fail `job_ids` into the dead-letter queue `queue` with `error` (code, message):
    fenced by a worker's `fence` (jobs_fail_fenced), only while the lock is older than
    `stale_after` seconds (jobs_fail_stale), or from `sources` (jobs_fail)."""
    illegal = set(sources) - ALLOWED[Status.FAILED]
    if illegal:
        raise TransitionRefusedError(
            job_id=",".join(str(j) for j in job_ids),
            current=",".join(sorted(illegal)),
            target=Status.FAILED,
            reason="not an allowed transition",
        )
    n = len(job_ids)
    common: dict[str, Any] = {
        "queues": [queue] * n,
        "codes": [error[0]] * n,
        "messages": [error[1]] * n,
        "data": {str(job_id): entry for job_id in job_ids},
    }
    if fence is not None:
        name = "jobs_fail_fenced"
        rows = change(
            name,
            job_ids=job_ids,
            actor=actor,
            attempts=[fence.attempt] * n,
            locked_by=fence.locked_by,
            **common,
        )
    elif stale_after is not None:
        name = "jobs_fail_stale"
        rows = change(
            name,
            job_ids=job_ids,
            actor=actor,
            sources=sources,
            stale_after=float(stale_after),
            **common,
        )
    else:
        name = "jobs_fail"
        rows = change(name, job_ids=job_ids, actor=actor, sources=sources, **common)
    return moved(name, rows)


def _count_dead_lettered(jobs: list[Job], reason: str) -> None:
    """jobs_failed_total and deadletter_total (jobs_dead_lettered_total, deprecated) of
    jobs failed with a dead letter for `reason`, once the transaction that opened their
    rows commits. Every failure has its dead letter, and only the dead letter's reason
    tells the class of the error (failure_class)."""
    for job in jobs:
        labels = metrics.jobs_labels(job.type)
        failed = metrics.JOBS_FAILED.labels(
            type=job.type,
            error_code=metrics.error_code_label(job.last_error_code),
            error_class=failure_class(reason=reason, error_code=job.last_error_code),
            **labels,
        )
        for counter in (
            failed,
            metrics.DEADLETTER.labels(**labels),
            metrics.JOBS_DEAD_LETTERED.labels(type=job.type, reason=reason),
        ):
            transaction.on_commit(counter.inc)


def _failed_entry(reason: str, error_code: str | None) -> dict[str, Any]:
    """What the `failed` audit entry says of why."""
    return {"reason": reason, "error_code": error_code}


def params_edits_settle(
    *, dead_letter_ids: Iterable[int], closed_as: str, actor: Actor, actor_user: Any
) -> int:
    """Reject the fix-forward edits still waiting on these dead letters, which the caller
    has just closed (`closed_as`: replayed, discarded) in its transaction, after locking
    their jobs and rows. Returns how many it rejected.

    Such an edit can never be applied (applying needs its row open), and left
    `requested` it would keep its job from the purge for ever, its decision in no chain
    (docs/operations/retention.md). Each is rejected by the operator who closed the row,
    audited `fix_forward_rejected` on its job's chain with the row's new state."""
    ids = list(dead_letter_ids)
    if not ids:
        return 0
    edits = list(
        ParamsEdit.objects.select_for_update()
        .filter(dead_letter_id__in=ids, state=ParamsEditState.REQUESTED)
        .order_by("id")
        .only("id", "job_id", "dead_letter_id")
    )
    if not edits:
        return 0
    user = actor_user if getattr(actor_user, "pk", None) is not None else None
    ParamsEdit.objects.filter(id__in=[e.id for e in edits]).update(
        state=ParamsEditState.REJECTED, decided_at=timezone.now(), rejected_by=user
    )
    # One entry per job and statement: a job with two such edits (two closed rows) takes
    # a second statement for its second.
    rounds: list[dict[Any, dict[str, Any]]] = []
    for edit in edits:
        entry = {
            "params_edit_id": edit.id,
            "dead_letter_id": edit.dead_letter_id,
            "dead_letter_closed": closed_as,
        }
        free = next((r for r in rounds if edit.job_id not in r), None)
        if free is None:
            rounds.append(free := {})
        free[edit.job_id] = entry
    for entries in rounds:
        jobs_audit(entries=entries, event_type="fix_forward_rejected", actor=actor)
    return len(edits)
