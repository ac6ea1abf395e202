"""A job that fails for good, with its dead letter (DESIGN.md 4.1).

Failing is part of a job's life: the worker (an error it cannot retry), the reaper (a
worker lost on the last attempt), the dispatcher (a type that no longer exists) and
the dead-letter watcher (a message the broker gave up on) all end a job here. The
operator tooling around dead letters (replay, discard, peek) is the `dlq` app.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from django.db import transaction

from audit.services import Actor
from jobs.models import DeadLetter, Job
from jobs.services.transitions import Fence, transition
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
    stale_after: float | None = None,
    broker_copy: bool = False,
    x_death: Any = None,
    headers: Any = None,
    message_id: str | None = None,
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
        job = transition(
            job_id=job_id,
            target=Status.FAILED,
            sources=sources or [Status.RUNNING],
            actor=actor,
            fence=fence,
            stale_after=stale_after,
            fields={
                "dead_letter_queue": queue,
                "last_error_code": error_code,
                "last_error_message": error_message,
            },
            audit_data={"reason": reason, "error_code": error_code},
        )
        dead_letter = DeadLetter.objects.create(
            job_id=job.id,
            queue=queue,
            reason=reason,
            error_code=error_code,
            error_message=error_message,
            broker_copy=broker_copy,
            x_death=x_death,
            headers=headers,
            message_id=message_id,
        )
    return job, dead_letter
