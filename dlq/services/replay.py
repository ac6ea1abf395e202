"""Replay and discard: an operator resolves open dead letters (docs/operations/dead-letters.md).

A replay runs the jobs again with a fresh retry budget, a discard closes the rows; both
take the selection of `dlq.services.selection`, lock through `dlq.services.locks` and,
after their commits, ack the broker copies of what they resolved away
(`dlq.services.copies`). The database row is authoritative.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Unpack

import structlog
from django.db import transaction
from django.db.models import QuerySet

from audit.services import OPS_CHAIN, Actor, audit_append
from dlq.services.copies import broker_copies_ack_stale
from dlq.services.locks import Locked, lock_jobs_then_open_rows
from dlq.services.selection import (
    Selection,
    dead_letter_selection_check,
    dead_letters_checked_selection,
    dead_letters_of,
    dead_letters_sample,
    dead_letters_selected,
)
from jobs.domain.states import Status
from jobs.integrations.topology import dlq_has_broker_copy, dlq_names
from jobs.models import DeadLetter, DeadLetterState
from jobs.services import job_publish, jobs_audit
from jobs.services.requeue import Resolution, jobs_requeue_locked
from tenants.selectors import operator_org_ids

log = structlog.get_logger("dlq")


@dataclass
class ResolveResult:
    """The answer of a replay or discard (also a dry run's: `matched` and `sample`)."""

    action: str
    dry_run: bool
    matched: int = 0
    sample: list[dict[str, Any]] = field(default_factory=list)
    # Replay only: open rows of the selection that name no job, which it cannot take.
    without_job: int = 0
    notes: list[str] = field(default_factory=list)  # what an operator should know, in words
    resolved: list[int] = field(default_factory=list)  # dead_letters ids
    job_ids: list[str] = field(default_factory=list)
    message_ids: list[str] = field(default_factory=list)  # broker copies of resolved rows
    skipped: list[dict[str, Any]] = field(default_factory=list)
    broker_acked: int = 0
    broker_error: str | None = None
    published: int = 0
    seconds: dict[str, float] = field(default_factory=dict)  # per phase, for operators

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


ReplayResult = ResolveResult
DiscardResult = ResolveResult


def dead_letters_replay(
    *,
    actor_user: Any,
    justification: str,
    dry_run: bool = False,
    publish: bool = False,
    **selection: Unpack[Selection],
) -> ReplayResult:
    """Replay open dead letters: their jobs run again with a fresh retry budget.

    Selection (`dead_letters_selected`): open rows that name a job, in `queue` (a DLQ
    name, e.g. `sim_dlq`), of `job_ids` or `dead_letter_ids`, matching `filters`
    (FILTER_FIELDS), oldest first, at most `limit`.
    1. Dry run: the count and a sample; nothing is written.
    2. In transactions of RESOLVE_CHUNK rows (jobs locked first, then their open rows):
       `failed` -> `pending` audited `dlq_replayed` (attempts keep counting,
       `max_attempts` grows by the type's max_retries + 1, the last error stays as
       history until a success clears it), the row -> `replayed` with the actor and
       justification. A row resolved meanwhile is skipped: replay is retry-safe.
    3. After the commits, one pass per DLQ acks away the broker copies whose rows are
       resolved (a failure only leaves stale copies for the next pass or replay).
    4. The dispatcher publishes the now-`pending` jobs (its next loop: their
       `created_at` is old). `publish=True` publishes them here as well, best effort
       (a failure stops the rest rather than wait on a dead broker; a double publish is
       harmless, the claim fences it); it costs one confirmed publish and one audited
       transition per job, so bulk replays leave it to the dispatcher.
    """
    return _resolve_selection(
        action="replay",
        actor_user=actor_user,
        justification=justification,
        dry_run=dry_run,
        publish=publish,
        **selection,
    )


def dead_letters_discard(
    *,
    actor_user: Any,
    justification: str,
    dry_run: bool = False,
    **selection: Unpack[Selection],
) -> DiscardResult:
    """Discard open dead letters: the rows close, the jobs stay `failed`.

    Same selection as replay, plus rows that name no job.
    1. Dry run: the count and a sample; nothing is written.
    2. In transactions of RESOLVE_CHUNK rows (jobs locked first, then their open rows):
       the rows -> `discarded` with actor and justification, audited `dlq_discarded` on
       each job's chain (the ops chain for a row without a job). Resolved rows are
       skipped.
    3. After the commits, the broker copies of resolved rows are acked away.
    """
    return _resolve_selection(
        action="discard",
        actor_user=actor_user,
        justification=justification,
        dry_run=dry_run,
        **selection,
    )


def _resolve_selection(
    *,
    action: str,
    actor_user: Any,
    justification: str,
    dry_run: bool,
    publish: bool = False,
    **selection: Unpack[Selection],
) -> ResolveResult:
    justification, filters, rows = dead_letters_checked_selection(
        action=action,
        actor_user=actor_user,
        justification=justification,
        dry_run=dry_run,
        **selection,
    )
    limit = selection.get("limit")
    result = ResolveResult(action=action, dry_run=dry_run)
    limited = rows[:limit] if limit is not None else rows
    _preview(
        result,
        limited,
        selection,
        filters=filters,
        scoped=operator_org_ids(actor_user) is not None,
    )
    if dry_run:
        return result
    clock = time.perf_counter()
    queues = dead_letters_resolve_rows(
        action=action,
        rows=list(limited.values_list("id", "job_id", "queue")),
        actor_user=actor_user,
        justification=justification,
        result=result,
    )
    clock = _lap(result, "transactions", clock)
    broker_copies_ack_resolved(result=result, queues=queues)
    clock = _lap(result, "ack_away", clock)
    if publish and action == "replay":
        result.published = _publish(result.job_ids)
        _lap(result, "publish", clock)
    return result


def dead_letters_preview(*, action: str, **selection: Unpack[Selection]) -> ResolveResult:
    """A dry run for the operator's shell (`manage.py dlq replay|discard --dry-run`
    without `--as`): what a replay or discard of `selection` would take, by an operator
    limited to no organisation. It writes nothing, so it needs neither an operator nor
    a justification; the shell that runs it reaches the whole database anyway. The
    selection is checked as for a run (queue, filters, limit)."""
    filters = dead_letter_selection_check(
        queue=selection.get("queue"), filters=selection.get("filters"), limit=selection.get("limit")
    )
    rows = dead_letters_of(action=action, selection=selection, filters=filters)
    limit = selection.get("limit")
    result = ResolveResult(action=action, dry_run=True)
    _preview(result, rows[:limit] if limit is not None else rows, selection, filters=filters)
    return result


def _preview(
    result: ResolveResult,
    limited: QuerySet[DeadLetter],
    selection: Selection,
    *,
    filters: dict[str, Any],
    scoped: bool = False,
) -> None:
    """What a dry run answers, into `result`: how many rows the action takes, a sample
    of them and, for a replay, how many it leaves out for naming no job."""
    result.matched = limited.count()
    # From the limited rows, so that the sample is what the run takes, in its order.
    result.sample = dead_letters_sample(limited)
    if result.action == "replay" and not scoped:
        # A row without a job is in no organisation: never a limited operator's.
        result.without_job = _count_without_job(selection, filters=filters)
        if result.without_job:
            result.notes.append(without_job_note(result.without_job))


def _count_without_job(selection: Selection, *, filters: dict[str, Any]) -> int:
    """Open rows of a replay's selection that name no job: the replay leaves them out
    (`dead_letters_selected`), and the operator is told how many and why."""
    if selection.get("job_ids") is not None:
        return 0  # rows chosen by job name a job
    rows = dead_letters_selected(
        action="discard",
        queue=selection.get("queue"),
        dead_letter_ids=selection.get("dead_letter_ids"),
        filters=filters,
    )
    return rows.filter(job__isnull=True).count()


def without_job_note(count: int) -> str:
    """Why a replay leaves `count` rows out, in the operator's words."""
    if count == 1:
        return "1 dead letter names no job: it can only be discarded."
    return f"{count} dead letters name no job: they can only be discarded."


def dead_letters_resolve_rows(
    *,
    action: str,
    rows: Iterable[tuple[int, uuid.UUID | None, str]],
    actor_user: Any,
    justification: str,
    result: ResolveResult,
    audit_extra: dict[str, Any] | None = None,
) -> set[str]:
    """Replay or discard each (row id, job id, queue) into `result`, RESOLVE_CHUNK rows
    per transaction.

    The caller has checked actor and justification. Returns the DLQs touched (their
    broker copies are acked away afterwards, outside any transaction).
    """
    by = Resolution(
        # A replay or discard is an operator's act on others' jobs (docs/tenancy.md).
        actor=Actor.operator(actor_user),
        actor_user=actor_user,
        justification=justification,
        audit_extra=audit_extra or {},
    )
    selected = list(rows)
    outcome: dict[int, dict[str, Any] | str] = {}
    resolve_chunk = _replay_chunk if action == "replay" else _discard_chunk
    for start in range(0, len(selected), RESOLVE_CHUNK):
        outcome |= resolve_chunk(selected[start : start + RESOLVE_CHUNK], by)
    queues: set[str] = set()
    for row_id, job_id, queue_name in selected:
        what = outcome[row_id]
        if isinstance(what, dict):
            job_text = str(job_id) if job_id else None
            result.skipped.append({"dead_letter_id": row_id, "job_id": job_text, **what})
            continue
        result.resolved.append(row_id)
        if job_id is not None:
            result.job_ids.append(str(job_id))
        if what:
            result.message_ids.append(what)
        queues.add(queue_name)
    return queues


def _lap(result: ResolveResult, phase: str, since: float) -> float:
    now = time.perf_counter()
    result.seconds[phase] = round(now - since, 3)
    return now


def _lock_chunk(
    chunk: Sequence[tuple[int, uuid.UUID | None, str]], job_fields: Sequence[str] = ("id",)
) -> Locked:
    """Lock the chunk's jobs, then its rows still open (`dlq.services.locks`)."""
    return lock_jobs_then_open_rows(
        job_ids=[job_id for _, job_id, _ in chunk],
        job_fields=job_fields,
        dead_letter_ids=[row_id for row_id, _, _ in chunk],
    )


# Rows resolved per transaction: one lock statement, one audited transition per job
# type, one update of the rows. A large replay commits in chunks, so a failure half way
# leaves whole chunks done and the rest open, both consistent and retry-safe.
RESOLVE_CHUNK = 500


def _replay_chunk(
    chunk: Sequence[tuple[int, uuid.UUID | None, str]], by: Resolution
) -> dict[int, dict[str, Any] | str]:
    """Replay one chunk in one transaction; returns, per dead letter id, why it was
    skipped (a dict) or, when its job was replayed, the row's message id ("" if none).

    1. Lock the jobs, then their rows still open (the order every writer uses).
    2. Put the failed jobs back in line (jobs.services.requeue, audited
       `dlq_replayed`) and mark their rows replayed; a job that is no longer `failed`
       is not moved and its row is skipped.
    """
    outcome: dict[int, dict[str, Any] | str] = {}
    with transaction.atomic():
        locked = _lock_chunk(chunk, job_fields=("id", "type", "status"))
        jobs = locked.jobs
        rows = {row.id: row for row in locked.open_rows}
        taken: list[DeadLetter] = []
        for row_id, job_id, _ in chunk:
            row = rows.get(row_id)
            if row is None or job_id not in jobs:
                outcome[row_id] = {"skipped": "already resolved"}
            elif jobs[job_id].status != Status.FAILED:
                outcome[row_id] = {"skipped": f"job is {jobs[job_id].status}, not failed"}
            else:
                taken.append(row)
        moved = jobs_requeue_locked(
            jobs=[jobs[row.job_id] for row in taken if row.job_id is not None],
            by=by,
            event_type="dlq_replayed",
            audit_data={row.job_id: by.audit_data(row) for row in taken if row.job_id},
            rows={row.job_id: [row.id] for row in taken if row.job_id is not None},
        )
        for row in taken:
            if row.job_id in moved:
                outcome[row.id] = row.message_id or ""
            else:
                outcome[row.id] = {"skipped": "job is no longer failed"}
    return outcome


def _discard_chunk(
    chunk: Sequence[tuple[int, uuid.UUID | None, str]], by: Resolution
) -> dict[int, dict[str, Any] | str]:
    """Discard one chunk in one transaction; returns, per dead letter id, why it was
    skipped (a dict) or, when it was discarded, its broker message id ("" if none).

    Jobs locked first, then their rows still open; one update closes the rows; each
    job's chain gets its `dlq_discarded` entry in one statement for the chunk (rows
    without a job: the ops chain, one entry each).
    """
    with transaction.atomic():
        rows = _lock_chunk(chunk).open_rows
        entries = {row.id: by.audit_data(row) for row in rows}
        with_job = {row.job_id: entries[row.id] for row in rows if row.job_id is not None}
        if with_job:
            jobs_audit(entries=with_job, event_type="dlq_discarded", actor=by.actor)
        for row in rows:
            if row.job_id is None:
                audit_append(
                    chain=OPS_CHAIN,
                    event_type="dlq_discarded",
                    actor=by.actor,
                    data=entries[row.id],
                )
        by.close([row.id for row in rows], state=DeadLetterState.DISCARDED)
    discarded = {row.id: row.message_id or "" for row in rows}
    return {
        row_id: discarded.get(row_id, {"skipped": "already resolved"}) for row_id, _, _ in chunk
    }


def broker_copies_ack_resolved(*, result: ResolveResult, queues: Iterable[str]) -> None:
    """Ack away the broker copies of resolved rows in `queues` (one pass per DLQ), into
    `result`; a broker that cannot be reached leaves them for a later pass."""
    # A queue the postgres executor runs has no broker DLQ (with JOBOPS_BROKER off, none
    # has): nothing to ack, and no broker to fail to reach.
    for name in sorted(q for q in queues if q in dlq_names() and dlq_has_broker_copy(q)):
        try:
            result.broker_acked += broker_copies_ack_stale(queue=name).acked
        except Exception as exc:  # broker down: the copies stay for a later pass
            log.warning("dlq_ack_away_failed", queue=name, error=repr(exc))
            result.broker_error = f"{name}: {exc!r}"


def _publish(job_ids: list[str]) -> int:
    published = 0
    for job_id in job_ids:
        try:
            if job_publish(job_id=job_id, sources=(Status.PENDING,)):
                published += 1
        except Exception as exc:  # the dispatcher publishes whatever is left pending
            log.warning("dlq_replay_publish_deferred", job_id=job_id, error=repr(exc))
            break
    return published
