"""The dead-letter watcher's reconciliation: each `dlq.watch` message becomes what the
database says it is (docs/architecture.md#dead-letters). The database row is
authoritative; `dlq.watcher` consumes the queue and acks after these commit.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import transaction

from audit.services import OPS_CHAIN, Actor, audit_append
from core.ids import uuid_or_none
from dlq.broker import DecodedMessage
from dlq.services.locks import lock_jobs_then_open_rows
from jobs.domain.states import Status
from jobs.integrations.topology import dlq_name
from jobs.models import DeadLetter, DeadLetterReason, Job
from jobs.services import (
    BrokerCopy,
    NewDeadLetter,
    dead_letters_create,
    job_audit,
    job_fail_with_dead_letter,
    job_lock_is_stale,
    jobs_audit,
    jobs_fail_with_dead_letters,
)

WATCHER = Actor.system("dlq-watcher")
LIVE_LOCK_NOTE = (
    "recorded by the dead-letter watcher: the job was running under a live lock, "
    "so its run decides the outcome; this broker copy needs no action"
)
# What reconciling reads of a locked job.
JOB_FIELDS = ("id", "status", "attempts", "queue")


class Outcome:
    """What the watcher did with one message (also its log field and metric label)."""

    FAILED = "failed"  # a broker-made dead letter: the job failed, a row opened
    BROKER_COPY = "broker_copy"  # a worker-made dead letter: its row now has the copy
    LIVE_LOCK = "live_lock"  # the job runs under a live lock: message recorded only
    NO_JOB = "no_job"  # undecodable, naming no job, or an unknown job: null-job row
    REPEAT = "repeat"  # this message was recorded already
    STALE = "stale"  # a copy of an earlier attempt, or of a resolved/ended job


def _broker_error(message: DecodedMessage) -> tuple[str, str]:
    reason = message.reason or DeadLetterReason.REJECTED
    count = next(
        (d.get("count") for d in message.x_death or [] if d.get("queue") == message.queue), None
    )
    text = f"dead-lettered by the broker ({reason}) in queue {message.queue}"
    if count is not None:
        text += f", x-death count {count}"
    return f"BROKER_{reason.upper()}", text


def _broker_copy(message: DecodedMessage) -> BrokerCopy:
    return BrokerCopy(
        x_death=message.x_death, headers=message.headers, message_id=message.message_id
    )


def dead_letter_reconcile(*, message: DecodedMessage) -> str:
    """Reconcile one `dlq.watch` message with the database; idempotent. Returns an Outcome.

    One transaction; the caller acks the message only after it commits.
    1. A message already recorded (same message id) changes nothing.
    2. No job (undecodable, no job id, unknown job): a null-job row with the raw body,
       audited `dead_lettered` on the ops chain.
    3. Lock the job, then its open dead letter (`dlq.services.locks`), then:
       - `failed` with an open row: mark `broker_copy` and audit `dead_lettered` once;
       - `pending`/`queued`/`retrying` whose attempt the message carries: `failed` + row
         (a broker-made dead letter: delivery limit, TTL, max length, a bare reject);
       - `running` with a stale lock: the same, conditioned on the stale lock;
       - `running` with a live lock: record the message in a row that is resolved at
         once (the job's own run decides its outcome; an open row would block it);
       - anything else (an earlier attempt's copy, a resolved or ended job): stale.
    """
    with transaction.atomic():
        if DeadLetter.objects.filter(message_id=message.message_id).exists():
            return Outcome.REPEAT
        job_id = uuid_or_none(message.job_id)
        locked = lock_jobs_then_open_rows(job_ids=[job_id], job_fields=JOB_FIELDS, of_jobs=True)
        job = locked.jobs.get(job_id) if job_id else None
        if job is None:
            _record_without_job(message=message, job_id_text=message.job_id)
            return Outcome.NO_JOB
        attempt = message.attempt
        if job.status == Status.FAILED:
            if attempt is not None and attempt < job.attempts:
                return Outcome.STALE  # a copy of an attempt before a replay
            row = locked.open_rows[0] if locked.open_rows else None
            if row is None:
                return Outcome.STALE
            if row.broker_copy:
                return Outcome.REPEAT
            row.broker_copy = True
            row.x_death, row.headers = message.x_death, message.headers
            row.message_id = row.message_id or message.message_id
            row.save(update_fields=["broker_copy", "x_death", "headers", "message_id"])
            _audit_dead_lettered(row, message)
            return Outcome.BROKER_COPY
        if job.status in (Status.PENDING, Status.QUEUED, Status.RETRYING):
            if attempt is not None and attempt <= job.attempts:
                return Outcome.STALE  # a copy from before a replay or a retry
            _fail_from_broker(job=job, message=message, sources=[job.status])
            return Outcome.FAILED
        if job.status == Status.RUNNING:
            if attempt is not None and attempt < job.attempts:
                return Outcome.STALE
            if job_lock_is_stale(job_id=job.id):
                _fail_from_broker(
                    job=job,
                    message=message,
                    sources=[Status.RUNNING],
                    stale_after=float(settings.JOBOPS_LOCK_TIMEOUT),
                )
                return Outcome.FAILED
            code, text = _broker_error(message)
            [row] = dead_letters_create(
                [
                    NewDeadLetter(
                        job_id=job.id,
                        queue=dlq_name(job.queue),
                        reason=message.reason or DeadLetterReason.REJECTED,
                        error_code=code,
                        error_message=text,
                        broker_copy=_broker_copy(message),
                        discarded_with=LIVE_LOCK_NOTE,
                    )
                ]
            )
            _audit_dead_lettered(row, message, live_lock=True)
            return Outcome.LIVE_LOCK
        return Outcome.STALE  # succeeded or cancelled: nothing to decide


def dead_letters_reconcile(*, messages: Sequence[DecodedMessage]) -> list[str | None]:
    """Reconcile the common case of a burst in a few statements for the whole batch:
    broker-made dead letters of jobs waiting in their queue (a delivery limit, a TTL,
    a bare reject of many messages). Returns an Outcome per message, or None for a
    message left to `dead_letter_reconcile` (the caller's, in the same transaction).

    The decisions are `dead_letter_reconcile`'s: a recorded message id is a repeat; a
    `pending`/`queued`/`retrying` job whose attempt the message carries fails with an
    open row (broker copy recorded) and its `failed` and `dead_lettered` entries. Jobs
    are locked first, in id order, as every writer does. Everything else (another
    state, no job, a second message of the same job or id in the batch) is left.
    """
    outcomes: list[str | None] = [None] * len(messages)
    seen: set[Any] = set()
    job_ids: dict[int, uuid.UUID] = {}  # message index -> its job, for the chosen ones
    for index, message in enumerate(messages):
        job_id = uuid_or_none(message.job_id)
        keys = {("job", job_id), ("message", message.message_id)}
        if job_id is not None and message.message_id and not keys & seen:
            job_ids[index] = job_id
        seen |= keys
    chosen = list(job_ids)
    if not chosen:
        return outcomes
    recorded = set(
        DeadLetter.objects.filter(
            message_id__in=[messages[i].message_id for i in chosen]
        ).values_list("message_id", flat=True)
    )
    jobs = lock_jobs_then_open_rows(
        job_ids=[job_ids[i] for i in chosen], job_fields=JOB_FIELDS
    ).jobs
    groups: dict[tuple[str, str, str, str, str], list[int]] = {}
    for index in chosen:
        message, job = messages[index], jobs.get(job_ids[index])
        if message.message_id in recorded:
            outcomes[index] = Outcome.REPEAT
        elif (
            job is not None
            and job.status in (Status.PENDING, Status.QUEUED, Status.RETRYING)
            and (message.attempt is None or message.attempt > job.attempts)
        ):
            code, text = _broker_error(message)
            reason = message.reason or DeadLetterReason.REJECTED
            key = (job.status, dlq_name(job.queue), reason, code, text)
            groups.setdefault(key, []).append(index)
    for (status, queue, reason, code, text), indexes in groups.items():
        rows = jobs_fail_with_dead_letters(
            job_ids=[job_ids[i] for i in indexes],
            source=status,
            queue=queue,
            reason=reason,
            actor=WATCHER,
            error_code=code,
            error_message=text,
            broker_copies={job_ids[i]: _broker_copy(messages[i]) for i in indexes},
        )
        jobs_audit(
            entries={row.job_id: _dead_lettered_entry(row, row.message_id) for row in rows},
            event_type="dead_lettered",
            actor=WATCHER,
        )
        failed = {row.job_id for row in rows}
        for i in indexes:
            if job_ids[i] in failed:
                outcomes[i] = Outcome.FAILED
    return outcomes


def _fail_from_broker(
    *,
    job: Job,
    message: DecodedMessage,
    sources: list[str],
    stale_after: float | None = None,
) -> DeadLetter:
    code, text = _broker_error(message)
    _, row = job_fail_with_dead_letter(
        job_id=job.id,
        reason=message.reason or DeadLetterReason.REJECTED,
        actor=WATCHER,
        error_code=code,
        error_message=text,
        sources=sources,
        stale_after=stale_after,
        broker_copy=_broker_copy(message),
    )
    _audit_dead_lettered(row, message)
    return row


def _record_without_job(*, message: DecodedMessage, job_id_text: str | None) -> DeadLetter:
    if message.decode_error and not job_id_text:
        code, text = "UNDECODABLE", message.decode_error
    elif not job_id_text:
        code, text = "NO_JOB", "the message names no job"
    else:
        code, text = "JOB_NOT_FOUND", f"the message names job {job_id_text!r}, which is unknown"
    [row] = dead_letters_create(
        [
            NewDeadLetter(
                job_id=None,
                queue=message.dlq or "unknown",
                reason=message.reason or DeadLetterReason.REJECTED,
                error_code=code,
                error_message=text,
                broker_copy=_broker_copy(message),
                body=message.body_text,
            )
        ]
    )
    _audit_dead_lettered(row, message)
    return row


def _audit(
    *, job_id: uuid.UUID | None, event_type: str, actor: Actor, data: dict[str, Any]
) -> None:
    """On the job's chain, or on the ops chain for a dead letter that names no job."""
    if job_id is not None:
        job_audit(job_id=job_id, event_type=event_type, actor=actor, data=data)
    else:
        audit_append(chain=OPS_CHAIN, event_type=event_type, actor=actor, data=data)


def _audit_dead_lettered(row: DeadLetter, message: DecodedMessage, **extra: Any) -> None:
    _audit(
        job_id=row.job_id,
        event_type="dead_lettered",
        actor=WATCHER,
        data=_dead_lettered_entry(row, message.message_id, **extra),
    )


def _dead_lettered_entry(row: DeadLetter, message_id: str | None, **extra: Any) -> dict[str, Any]:
    """What a `dead_lettered` entry says: the row, why, and which broker message."""
    return {
        "dead_letter_id": row.id,
        "queue": row.queue,
        "reason": row.reason,
        "message_id": message_id,
        **extra,
    }
