"""Cancelling a job (docs/architecture.md): a client's or operator's request, idempotent."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction

from audit.services import Actor
from jobs.domain.exceptions import JobCancelForbiddenError, JobNotFoundError
from jobs.models import Job
from jobs.selectors import job_actor_for_user
from jobs.services.transitions import change, job_cancel_request, moved


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
        cancelled = moved("jobs_cancel", change("jobs_cancel", job_ids=[job_id], actor=actor))
        if cancelled:
            return cancelled[0]
        job = Job.objects.filter(id=job_id).first()
        if job is None:
            raise JobNotFoundError()
        return job


def job_cancel_for_user(*, job_id: uuid.UUID | str, user: Any, staff: bool = False) -> Job:
    """Cancel on behalf of `user` (the API): their own job; any job of an organisation
    they administer; or, with staff powers (staff with a verified second factor) and the
    operator's `jobs.cancel_job` permission, any job they may see
    (jobs.selectors.job_actor_for_user decides, and who is audited)."""
    actor = job_actor_for_user(
        job_id=job_id,
        user=user,
        staff=staff,
        permission="jobs.cancel_job",
        forbidden=JobCancelForbiddenError,
    )
    return job_cancel(job_id=job_id, actor=actor)
