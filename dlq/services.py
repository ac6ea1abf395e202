"""Dead-letter write paths (DESIGN.md 4.1). The database row is authoritative."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from django.db import transaction

from audit.services import Actor
from dlq.models import DeadLetter
from jobs.models import Job
from jobs.services import Fence, transition
from jobs.states import Status
from jobs.topology import dlq_name


def job_fail_with_dead_letter(
    *,
    job_id: uuid.UUID | str,
    reason: str,
    actor: Actor,
    error_code: str | None = None,
    error_message: str | None = None,
    fence: Fence | None = None,
    sources: Iterable[str] | None = None,
    where: str = "",
    where_params: Iterable[Any] = (),
    broker_copy: bool = False,
    x_death: Any = None,
    headers: Any = None,
) -> tuple[Job, DeadLetter]:
    """Move a job to `failed` and open its dead letter, in one transaction.

    1. The compare-and-set transition to `failed` (fenced for a worker; `where` lets the
       reaper add its stale-lock condition); raises JobLost / TransitionRefusedError.
    2. The `dead_letters` row for the job's DLQ; the partial unique index keeps it to
       one open row per job.
    The caller rejects the broker message (requeue=False) only after this commits.
    """
    with transaction.atomic():
        # The queue is needed before the UPDATE to set dead_letter_queue in the same write.
        queue = Job.objects.values_list("queue", flat=True).get(id=job_id)
        job = transition(
            job_id=job_id,
            target=Status.FAILED,
            sources=sources or [Status.RUNNING],
            actor=actor,
            fence=fence,
            where=where,
            where_params=where_params,
            set_fields={
                "dead_letter_queue": dlq_name(queue),
                "last_error_code": error_code,
                "last_error_message": error_message,
                "locked_by": None,
                "locked_at": None,
            },
            audit_data={"reason": reason, "error_code": error_code},
        )
        dead_letter = DeadLetter.objects.create(
            job_id=job.id,
            queue=dlq_name(queue),
            reason=reason,
            error_code=error_code,
            error_message=error_message,
            broker_copy=broker_copy,
            x_death=x_death,
            headers=headers,
        )
    return job, dead_letter
