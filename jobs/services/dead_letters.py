"""A job that fails for good, with its dead letter (docs/architecture.md#dead-letters).

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
from jobs.services.transitions import Fence, transition, transition_many
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
            fields=_failed_fields(queue, error_code, error_message),
            audit_data=_failed_entry(reason, error_code),
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


def jobs_fail_with_dead_letters(
    *,
    job_ids: list[uuid.UUID],
    source: str,
    queue: str,
    reason: str,
    actor: Actor,
    error_code: str | None,
    error_message: str | None,
    broker_copies: dict[uuid.UUID, dict[str, Any]],
) -> list[DeadLetter]:
    """`job_fail_with_dead_letter` for many jobs of one DLQ `queue` that fail from
    `source` for the same reason, in one transition statement and one insert (the
    dead-letter watcher's burst of broker-made dead letters). `broker_copies` holds
    each job's broker copy (x_death, headers, message_id). A job no longer in `source`
    is left as it is; returns the rows opened. The caller holds the transaction.
    """
    moved = transition_many(
        job_ids=list(job_ids),
        target=Status.FAILED,
        sources=[source],
        actor=actor,
        fields=_failed_fields(queue, error_code, error_message),
        audit_data={str(job_id): _failed_entry(reason, error_code) for job_id in job_ids},
    )
    return DeadLetter.objects.bulk_create(
        DeadLetter(
            job_id=job.id,
            queue=queue,
            reason=reason,
            error_code=error_code,
            error_message=error_message,
            broker_copy=True,
            **broker_copies[job.id],
        )
        for job in moved
    )


def _failed_fields(queue: str, error_code: str | None, error_message: str | None) -> dict[str, Any]:
    """What failing sets on the job row besides its status."""
    return {
        "dead_letter_queue": queue,
        "last_error_code": error_code,
        "last_error_message": error_message,
    }


def _failed_entry(reason: str, error_code: str | None) -> dict[str, Any]:
    """What the `failed` audit entry says of why."""
    return {"reason": reason, "error_code": error_code}
