"""Pausing and resuming a queue (docs/operator-controls.md#pausing-a-queue).

A pause is a `queue_pauses` row (jobs.models.QueuePause), shared by every host:

- the dispatcher publishes none of a paused queue's pending or due retrying jobs (its
  statements skip them: jobs/queries.sql due_pending_jobs, due_retrying_jobs); they wait
  in PostgreSQL, and creation still answers 201;
- a worker that receives a message of a paused queue (published before the pause) claims
  nothing: the claim's `queue_active` condition refuses it, and the worker holds the job
  (`queued -> pending`, `held` with reason `queue_paused`, no attempt spent) and acks;
- running jobs finish.

Resume deletes the row; the dispatcher is woken (NOTIFY jobs_pending) and publishes the
backlog through the broker window, highest priority first. Both are audited on the ops
chain (`queue_paused`, `queue_resumed`) with the operator's justification, in the same
transaction as the change.
"""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from audit.services import OPS_CHAIN, Actor, audit_append
from jobs.domain.exceptions import QueueControlInputError, QueueNotFoundError
from jobs.domain.types import primary_queue_names
from jobs.models import QueuePause
from jobs.queries import QUERIES
from jobs.selectors import queues_for_consumers_forget
from jobs.services.reasons import control_reason

QUEUE_PAUSED_EVENT = "queue_paused"
QUEUE_RESUMED_EVENT = "queue_resumed"


def _checked(queue: str, reason: str) -> str:
    if queue not in primary_queue_names():
        raise QueueNotFoundError(f"no queue {queue!r}", details={"queue": queue})
    return control_reason(reason, error=QueueControlInputError)


def _audit(event_type: str, *, queue: str, reason: str, actor: Actor) -> None:
    """A pause's or resume's ops entry: which queue, and the operator's justification."""
    audit_append(
        chain=OPS_CHAIN, event_type=event_type, actor=actor, data={"queue": queue, "reason": reason}
    )


def queue_pause(*, queue: str, reason: str, actor: Actor, user: Any = None) -> bool:
    """Pause `queue`; True when it was running and is now paused, False when it was
    paused already (nothing written: the first pause and its justification stand).

    The row and its `queue_paused` entry commit together (a concurrent second pause
    conflicts on the primary key and writes nothing)."""
    reason = _checked(queue, reason)
    with transaction.atomic():
        _, created = QueuePause.objects.get_or_create(
            queue=queue,
            defaults={"paused_at": timezone.now(), "paused_by": user, "reason": reason},
        )
        if created:
            _audit(QUEUE_PAUSED_EVENT, queue=queue, reason=reason, actor=actor)
    queues_for_consumers_forget()
    return created


def queue_resume(*, queue: str, reason: str, actor: Actor) -> bool:
    """Resume `queue`; True when it was paused, False when it was not (nothing written).

    Wakes the dispatcher on commit (NOTIFY jobs_pending), which publishes the queue's
    backlog through its broker window, highest priority first, then oldest."""
    reason = _checked(queue, reason)
    with transaction.atomic():
        deleted, _ = QueuePause.objects.filter(queue=queue).delete()
        if deleted:
            _audit(QUEUE_RESUMED_EVENT, queue=queue, reason=reason, actor=actor)
            with connection.cursor() as cursor:
                cursor.execute(QUERIES["notify_pending"])
    queues_for_consumers_forget()
    return bool(deleted)
