"""The broker's copies of dead letters in each `<q>_dlq`: which no longer stand for an
open dead letter, and the pass that acks those away (docs/operations/dead-letters.md).
The database row is authoritative; a copy is only what an operator peeks at.
"""

from __future__ import annotations

from typing import Any

from core.ids import uuid_or_none
from dlq.broker import DecodedMessage, DrainResult, dlq_drain
from jobs.domain.states import Status
from jobs.models import DeadLetter, DeadLetterState, Job


def stale_message_ids(messages: list[DecodedMessage]) -> set[str]:
    """Which broker copies in a DLQ no longer stand for an open dead letter.

    Three queries per batch, whatever its size. A copy is stale when its own row is
    resolved; or, before the watcher has recorded it, when its job has no open row and
    the copy belongs to an earlier attempt (or the job ended). A copy nothing in the
    database accounts for yet (the watcher is behind) is kept.
    """
    ids = [m.message_id for m in messages]
    by_message = dict(
        DeadLetter.objects.filter(message_id__in=ids).values_list("message_id", "state")
    )
    job_ids = {
        uuid_or_none(m.job_id) for m in messages if m.message_id not in by_message and m.job_id
    } - {None}
    jobs = {
        str(j): (status, attempts)
        for j, status, attempts in Job.objects.filter(id__in=job_ids).values_list(
            "id", "status", "attempts"
        )
    }
    with_open = {
        str(j)
        for j in DeadLetter.objects.filter(
            job_id__in=job_ids, state=DeadLetterState.OPEN
        ).values_list("job_id", flat=True)
    }
    stale: set[str] = set()
    for m in messages:
        if m.message_id in by_message:
            if by_message[m.message_id] != DeadLetterState.OPEN:
                stale.add(m.message_id)
            continue
        job_key = str(uuid_or_none(m.job_id)) if uuid_or_none(m.job_id) else None
        if job_key is None or job_key not in jobs or job_key in with_open:
            continue
        status, attempts = jobs[job_key]
        if status in (Status.SUCCEEDED, Status.CANCELLED, Status.FAILED):
            stale.add(m.message_id)
        elif m.attempt is not None and (
            m.attempt < attempts or (m.attempt == attempts and status != Status.RUNNING)
        ):
            stale.add(m.message_id)
    return stale


def broker_copies_ack_stale(
    *, queue: str, max_messages: int = 100_000, connection: Any = None
) -> DrainResult:
    """One pass over a DLQ acking every copy whose dead letter is resolved (see above)."""
    return dlq_drain(
        queue=queue, decide=stale_message_ids, max_messages=max_messages, connection=connection
    )
