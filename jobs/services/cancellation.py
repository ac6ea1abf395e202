"""Cancelling a job (docs/architecture.md): a client's or operator's request, idempotent."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction

from audit.models import ActorType
from audit.services import Actor
from jobs.exceptions import JobCancelForbiddenError, JobNotFoundError, TransitionRefusedError
from jobs.models import Job
from jobs.selectors import job_visible_queryset
from jobs.services.transitions import job_cancel_request, transition
from jobs.states import Status
from tenants.selectors import actor_for, administers


def job_cancel(*, job_id: uuid.UUID | str, actor: Actor) -> Job:
    """Request cancellation (docs/architecture.md#cancellation); idempotent.

    1. Raise the flag once (audit `cancel_requested`) unless the job already ended.
    2. A job that has not started moves to `cancelled` now; a running one stops at
       its handler's next check_cancel(). A lost race (it just started) is fine:
       the flag is set and the worker will see it.
    """
    with transaction.atomic():
        # The flag and its entry in one statement; nothing when already raised or ended.
        job_cancel_request(job_id=job_id, actor=actor)
        try:
            return transition(
                job_id=job_id,
                target=Status.CANCELLED,
                sources=[Status.SCHEDULED, Status.PENDING, Status.QUEUED, Status.RETRYING],
                actor=actor,
            )
        except TransitionRefusedError as refused:
            if refused.current is None:
                raise JobNotFoundError() from refused
            return Job.objects.get(id=job_id)


def job_cancel_for_user(*, job_id: uuid.UUID | str, user: Any, staff: bool = False) -> Job:
    """Cancel on behalf of `user` (the API): their own job; any job of an organisation
    they administer; or, with staff powers (staff with a verified second factor) and the
    operator's `jobs.cancel_job` permission, any job they may see. One visibility read; a
    job the user may not see is not found (404, never 403, so ids cannot be probed).
    Audited as the user (or service account) for their own job, as an operator
    otherwise."""
    found = (
        job_visible_queryset(user=user, staff=staff)
        .filter(id=job_id)
        .values_list("owner_id", "org_id")
        .first()
    )
    if found is None:
        raise JobNotFoundError()
    owner_id, org_id = found
    if owner_id == user.pk:
        return job_cancel(job_id=job_id, actor=actor_for(user))
    if not (staff and user.has_perm("jobs.cancel_job")) and not administers(user, org_id):
        raise JobCancelForbiddenError()
    return job_cancel(job_id=job_id, actor=Actor(ActorType.OPERATOR, str(user.pk)))
