"""Retry and re-run (docs/operator-controls.md#retry-and-re-run).

- `job_retry_for_user`: the owner (or an admin of the job's organisation, or an
  operator) runs a `failed` job again: the same job under the rules of an operator's
  replay (dlq.services.replay): attempts keep counting, a fresh retry budget, the open
  dead letter marked `replayed` by the caller; audited `retried`.
- `job_rerun`: an operator runs a finished job again as a NEW job (same type, params,
  organisation, project and owner) that names the original (`rerun_of`); the new job's
  `created` entry names the original, the original's chain gets a `rerun` entry.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.services import Actor
from jobs import metrics
from jobs.exceptions import (
    JobInputError,
    JobNotFoundError,
    JobRerunForbiddenError,
    JobRetryForbiddenError,
    TransitionRefusedError,
)
from jobs.models import DeadLetter, DeadLetterState, Job
from jobs.selectors import job_actor_for_user
from jobs.services.creation import job_create
from jobs.services.dead_letters import params_edits_settle
from jobs.services.transitions import job_audit, jobs_requeue
from jobs.states import Status
from jobs.types import get_type
from tenants.selectors import Placement, operator_org_ids

# A retry's reason and a re-run's justification: a sentence, not a document.
MAX_REASON_CHARS = 1000
DEFAULT_RETRY_REASON = "retried by owner"
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


def _digest(text: str) -> str:
    # As a replay's justification: the text stays on the dead letter, the chain its digest.
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def job_retry_for_user(
    *, job_id: uuid.UUID | str, user: Any, staff: bool = False, reason: Any = None
) -> Job:
    """Retry on behalf of `user` (the API): their own job; a job of an organisation they
    administer; or, with staff powers and jobs.replay_deadletter, any job they may see
    (an operator limited to some organisations sees only theirs). A job the user may
    not see is not found (404). Audited as the user (or service account) for their own
    job, as an operator otherwise."""
    justification = clean_reason(reason, field="reason", required=False) or DEFAULT_RETRY_REASON
    actor = job_actor_for_user(
        job_id=job_id,
        user=user,
        staff=staff,
        permission=REPLAY_PERMISSION,
        forbidden=JobRetryForbiddenError,
    )
    return job_retry_failed(job_id=job_id, actor=actor, user=user, justification=justification)


def job_retry_failed(
    *, job_id: uuid.UUID | str, actor: Actor, user: Any, justification: str
) -> Job:
    """`failed` -> `pending` audited `retried`, with a fresh retry budget, and the job's
    open dead letter (if any) -> `replayed` by `user`, in one transaction.

    Locks as every dead-letter writer does (dlq.services.locks): the job, then its open
    rows. Any other status: TransitionRefusedError (409 ERR-JOB-409 naming it), so a
    second retry of a job that is pending again changes nothing.
    """
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(id=job_id).only("id", "type", "status").first()
        if job is None:
            raise JobNotFoundError()
        rows = list(
            DeadLetter.objects.select_for_update()
            .filter(job_id=job.id, state=DeadLetterState.OPEN)
            .order_by("id")
            .only("id", "reason", "queue", "message_id")
        )
        if job.status != Status.FAILED:
            raise TransitionRefusedError(job_id=job.id, current=job.status, target=Status.PENDING)
        spec = get_type(job.type)
        row = rows[0] if rows else None
        [moved] = jobs_requeue(
            job_ids=[job.id],
            extend=spec.max_attempts if spec is not None else 1,
            event_type="retried",
            actor=actor,
            data={
                str(job.id): {
                    "dead_letter_id": row.id if row else None,
                    "reason": row.reason if row else None,
                    "queue": row.queue if row else None,
                    "message_id": row.message_id if row else None,
                    "justification_sha256": _digest(justification),
                }
            },
        )
        if rows:
            DeadLetter.objects.filter(id__in=[r.id for r in rows]).update(
                state=DeadLetterState.REPLAYED,
                resolved_by=user,
                resolved_at=timezone.now(),
                justification=justification,
            )
            params_edits_settle(
                dead_letter_ids=[r.id for r in rows],
                closed_as=DeadLetterState.REPLAYED,
                actor=actor,
                actor_user=user,
            )
            transaction.on_commit(lambda: metrics.DLQ_REPLAY.inc(len(rows)))
    return moved


def job_rerun(*, job_id: uuid.UUID | str, actor_user: Any, justification: Any) -> Job:
    """Run a finished job again as a new job that names it (`rerun_of`).

    1. Only an active staff member with jobs.replay_deadletter, on a job they may see
       (an operator limited to some organisations: of those); a justification.
    2. In one transaction: the new job through `job_create` (same type, params,
       organisation, project and owner; validated again by the type's schema of
       today; no idempotency key: always new), its `created` entry naming the
       original, and the original's `rerun` entry naming the new job and the
       justification. A job that has not ended: 409 ERR-JOB-409.
    """
    if not (
        actor_user is not None
        and getattr(actor_user, "is_active", False)
        and getattr(actor_user, "is_staff", False)
        and actor_user.has_perm(REPLAY_PERMISSION)
    ):
        raise JobRerunForbiddenError()
    text = clean_reason(justification, field="justification", required=True)
    jobs = Job.objects.select_related("owner")
    org_ids = operator_org_ids(actor_user)
    if org_ids is not None:
        jobs = jobs.filter(org_id__in=org_ids)
    original = jobs.filter(id=job_id).first()
    if original is None:
        raise JobNotFoundError()
    if original.status not in RERUN_SOURCES:
        raise TransitionRefusedError(
            job_id=original.id,
            current=original.status,
            target=Status.PENDING,
            reason="only a finished job can be re-run",
        )
    actor = Actor.operator(actor_user)
    with transaction.atomic():
        new, _ = job_create(
            owner=original.owner,
            job_type=original.type,
            params=original.params,
            correlation_id=original.correlation_id,
            actor=actor,
            # The original's params were accepted (staff-only ones too); the operator
            # re-runs them, not chooses them.
            staff=True,
            placement=Placement(org_id=original.org_id, project_id=original.project_id),
            rerun_of=original,
            priority=original.priority,
        )
        job_audit(
            job_id=original.id,
            event_type="rerun",
            actor=actor,
            data={"rerun_job_id": str(new.id), "justification": text},
        )
    return new
