"""Put an ended job back in line: the one rule behind an operator's replay
(dlq.services.replay), an owner's retry and an operator's re-run (jobs.services.retry)
and a fix-forward (dlq.services.fix_forward); docs/operator-controls.md#retry-and-re-run.

- Who and why: `operator_may_requeue` (active staff with jobs.replay_deadletter) for
  an operator's act on others' jobs; `clean_reason` for a retry's reason or a
  re-run's justification, `justification_digest` for what the chain holds of it.
- The lock order: the jobs, then their open dead letters
  (`jobs.services.dead_letters.lock_jobs_then_open_rows`); `job_ended_locked` takes a
  re-run's original under it.
- The write (`jobs_requeue_locked`): `failed` -> `pending` in one audited statement
  per job type, with a fresh retry budget (attempts keep counting, max_attempts grows
  by the type's max_retries + 1) and the previous run's leftovers reset
  (jobs_requeue); the moved jobs' open dead letters -> `replayed` by the actor with
  the justification, the fix-forward edits that waited on them rejected
  (`params_edits_settle`); the closed rows counted in dlq_replay once the
  transaction commits. A re-run puts a new job in line instead (`job_create`): the
  original stays as it ended.
"""

from __future__ import annotations

import datetime
import hashlib
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.services import Actor
from jobs.domain.exceptions import JobInputError, JobNotFoundError, TransitionRefusedError
from jobs.domain.states import Status
from jobs.domain.types import get_type
from jobs.integrations import metrics
from jobs.models import DeadLetter, DeadLetterState, Job
from jobs.services.dead_letters import lock_jobs_then_open_rows, params_edits_settle
from jobs.services.transitions import job_requeue_with_params, jobs_requeue
from tenants.selectors import operator_may

# A retry's reason and a re-run's justification: a sentence, not a document.
MAX_REASON_CHARS = 1000
REPLAY_PERMISSION = "jobs.replay_deadletter"
# What a re-run may start again: a job that has ended.
RERUN_SOURCES = (Status.SUCCEEDED, Status.CANCELLED, Status.FAILED)


def clean_reason(value: Any, *, field: str, required: bool) -> str:
    """A stripped, bounded free text (400 ERR-JOB-400 otherwise)."""
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise JobInputError(details={field: ["A string."]})
    cleaned = value.strip()
    if required and not cleaned:
        raise JobInputError(details={field: ["This field is required."]})
    if len(cleaned) > MAX_REASON_CHARS:
        raise JobInputError(details={field: [f"At most {MAX_REASON_CHARS} characters."]})
    if "\x00" in cleaned:
        raise JobInputError(details={field: ["No NUL characters."]})
    return cleaned


def justification_digest(justification: str) -> str:
    """What the chain holds of a justification: the text stays on the dead letter (it
    may name people), the chain its digest, so an edit of the stored text is still
    detectable."""
    return hashlib.sha256(justification.encode("utf-8")).hexdigest()


def operator_may_requeue(user: Any, permission: str = REPLAY_PERMISSION) -> bool:
    """Whether `user` may put others' jobs back in line: active staff with
    `permission` (jobs.replay_deadletter)."""
    return operator_may(user, permission)


@dataclass(frozen=True)
class Resolution:
    """Who puts jobs back in line (or discards their dead letters) and why: the actor
    the chain names, the user the rows name, the justification, and what each audit
    entry adds (a bulk operation's id)."""

    actor: Actor
    actor_user: Any
    justification: str
    audit_extra: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def digest(self) -> str:
        return justification_digest(self.justification)

    def audit_data(self, row: DeadLetter | None) -> dict[str, Any]:
        """What a replay, retry or discard audits about the dead letter it closes (None:
        the job had none): which row, why it died, which broker message it was, and the
        justification's digest."""
        return {
            "dead_letter_id": row.id if row else None,
            "reason": row.reason if row else None,
            "queue": row.queue if row else None,
            "message_id": row.message_id if row else None,
            "justification_sha256": self.digest,
            **self.audit_extra,
        }

    def close(
        self, ids: Sequence[int], *, state: str, now: datetime.datetime | None = None
    ) -> None:
        """Mark the open rows `ids` `state` (replayed, discarded) by this user with the
        justification; then reject the fix-forward edits that waited on them (they
        could never be applied now), after the rows' own entries. The caller holds
        the locks."""
        if not ids:
            return
        DeadLetter.objects.filter(id__in=ids).update(
            state=state,
            resolved_by=self.actor_user,
            resolved_at=now or timezone.now(),
            justification=self.justification,
        )
        params_edits_settle(
            dead_letter_ids=ids, closed_as=state, actor=self.actor, actor_user=self.actor_user
        )


@dataclass(frozen=True)
class NewParams:
    """A fix-forward's params for the one job it puts back in line, with their hash."""

    params: dict[str, Any]
    params_hash: str


def jobs_requeue_locked(
    *,
    jobs: Iterable[Job],
    by: Resolution,
    event_type: str,
    audit_data: Mapping[uuid.UUID, dict[str, Any]],
    rows: Mapping[uuid.UUID, Sequence[int]],
    new_params: NewParams | None = None,
    now: datetime.datetime | None = None,
) -> dict[uuid.UUID, Job]:
    """Put `failed` jobs back in line; returns the jobs that moved, by id.

    The caller holds the locks (`lock_jobs_then_open_rows`, the jobs' `type` loaded)
    and the transaction, and has checked that each job is `failed`; a job that is not
    is simply not moved. Per job type (its retry budget), one statement moves the jobs
    to `pending` with their `event_type` entries (`audit_data` per job id; a
    fix-forward's one job with `new_params`) and wakes the dispatcher. The
    moved jobs' open dead letters (`rows`: per job id) -> `replayed`
    (`Resolution.close`), counted once the transaction commits.
    """
    by_type: dict[str, list[uuid.UUID]] = {}
    for job in jobs:
        by_type.setdefault(job.type, []).append(job.id)
    moved: dict[uuid.UUID, Job] = {}
    for job_type, job_ids in by_type.items():
        spec = get_type(job_type)
        for job in _put_back(
            job_ids,
            extend=spec.max_attempts if spec is not None else 1,
            event_type=event_type,
            actor=by.actor,
            data={str(job_id): audit_data[job_id] for job_id in job_ids},
            new_params=new_params,
        ):
            moved[job.id] = job
    closed = [row_id for job_id in moved for row_id in rows.get(job_id, ())]
    by.close(closed, state=DeadLetterState.REPLAYED, now=now)
    if closed:
        transaction.on_commit(lambda: metrics.DLQ_REPLAY.inc(len(closed)))
    return moved


def _put_back(
    job_ids: list[uuid.UUID],
    *,
    extend: int,
    event_type: str,
    actor: Actor,
    data: dict[str, dict[str, Any]],
    new_params: NewParams | None,
) -> list[Job]:
    """The one write of this rule: `failed` -> `pending` (jobs_requeue, which also clears
    the previous run's leftovers), `extend` more attempts, each job's entry with its
    `data`, and `new_params` set when a fix-forward gives them; returns the jobs moved
    (one no longer failed is not among them)."""
    if new_params is None:
        return jobs_requeue(
            job_ids=list(job_ids), extend=extend, event_type=event_type, actor=actor, data=data
        )
    moved = []
    for job_id in job_ids:  # a fix-forward edits one job
        job = job_requeue_with_params(
            job_id=job_id,
            params=new_params.params,
            params_hash=new_params.params_hash,
            extend=extend,
            event_type=event_type,
            actor=actor,
            data=data[str(job_id)],
        )
        if job is not None:
            moved.append(job)
    return moved


def job_requeue_one(*, job_id: uuid.UUID | str, by: Resolution, event_type: str) -> Job:
    """One `failed` job back in line with its open dead letter (if any), in one
    transaction: an owner's retry. The job, then its open rows, locked; any other
    status: TransitionRefusedError (409 naming it), so a second retry of a job that is
    pending again changes nothing. A job that does not exist: JobNotFoundError."""
    with transaction.atomic():
        locked = lock_jobs_then_open_rows(
            job_ids=[uuid.UUID(str(job_id))], job_fields=("id", "type", "status"), of_jobs=True
        )
        job = next(iter(locked.jobs.values()), None)
        if job is None:
            raise JobNotFoundError()
        if job.status != Status.FAILED:
            raise TransitionRefusedError(job_id=job.id, current=job.status, target=Status.PENDING)
        rows = locked.open_rows
        moved = jobs_requeue_locked(
            jobs=[job],
            by=by,
            event_type=event_type,
            audit_data={job.id: by.audit_data(rows[0] if rows else None)},
            rows={job.id: [row.id for row in rows]},
        )
    return moved[job.id]


def job_ended_locked(*, job_id: uuid.UUID, reason: str) -> Job:
    """Lock a job that has ended (RERUN_SOURCES) before a new job starts it again, in
    the caller's transaction and the lock order of every writer that puts a job back
    in line (the job first); one that has not: TransitionRefusedError (409) with
    `reason`."""
    job = lock_jobs_then_open_rows(job_ids=[job_id], job_fields=("id", "status")).jobs.get(job_id)
    if job is None:
        raise JobNotFoundError()
    if job.status not in RERUN_SOURCES:
        raise TransitionRefusedError(
            job_id=job.id, current=job.status, target=Status.PENDING, reason=reason
        )
    return job
