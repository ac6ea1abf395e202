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

import uuid
from typing import Any

from django.db import transaction

from audit.services import Actor
from jobs.domain.exceptions import JobNotFoundError, JobRerunForbiddenError, JobRetryForbiddenError
from jobs.models import Job
from jobs.selectors import job_actor_for_user
from jobs.services.creation import job_create
from jobs.services.requeue import (
    MAX_REASON_CHARS,
    REPLAY_PERMISSION,
    RERUN_SOURCES,
    Resolution,
    clean_reason,
    job_ended_locked,
    job_requeue_one,
    operator_may_requeue,
)
from jobs.services.transitions import job_audit
from tenants.selectors import Placement, operator_org_ids

DEFAULT_RETRY_REASON = "retried by owner"
# The names this module gave the rules that now live in jobs.services.requeue.
__all__ = [
    "DEFAULT_RETRY_REASON",
    "MAX_REASON_CHARS",
    "REPLAY_PERMISSION",
    "RERUN_SOURCES",
    "clean_reason",
    "job_rerun",
    "job_retry_failed",
    "job_retry_for_user",
]


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
    open dead letter (if any) -> `replayed` by `user`, in one transaction: the rule of
    every way back in line (jobs.services.requeue.job_requeue_one). Any other status:
    TransitionRefusedError (409 ERR-JOB-409 naming it), so a second retry of a job that
    is pending again changes nothing.
    """
    by = Resolution(actor=actor, actor_user=user, justification=justification)
    return job_requeue_one(job_id=job_id, by=by, event_type="retried")


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
    if not operator_may_requeue(actor_user):
        raise JobRerunForbiddenError()
    text = clean_reason(justification, field="justification", required=True)
    jobs = Job.objects.select_related("owner")
    org_ids = operator_org_ids(actor_user)
    if org_ids is not None:
        jobs = jobs.filter(org_id__in=org_ids)
    original = jobs.filter(id=job_id).first()
    if original is None:
        raise JobNotFoundError()
    actor = Actor.operator(actor_user)
    with transaction.atomic():
        # Under the lock every way back in line takes (the job first): a replay of the
        # same failed job waits for this re-run, or this re-run for it.
        job_ended_locked(job_id=original.id, reason="only a finished job can be re-run")
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
