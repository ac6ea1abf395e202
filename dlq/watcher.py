"""The dead-letter watcher (docs/architecture.md): consumes `dlq.watch`, reconciles each message.

Every `<q>.dlx` routes a dead letter both to its `<q>_dlq` (the copy operators peek and
replay) and to `dlq.watch` (this consumer's queue). The dispatcher calls `watch_once()`
every loop; it can also run alone (`manage.py dlq watch`).
"""

from __future__ import annotations

import time
from typing import Any

import structlog
from amqp.exceptions import NotFound
from django.db import InterfaceError, OperationalError, transaction
from kombu import Connection

from core.broker import broker_channel
from dlq.broker import DecodedMessage, decode_amqp, queue_depth
from dlq.services.copies import broker_copies_ack_stale
from dlq.services.reconcile import Outcome, dead_letter_reconcile, dead_letters_reconcile
from jobs.integrations.topology import WATCH_QUEUE_NAME

log = structlog.get_logger("dlq.watcher")


# Messages reconciled per transaction: one commit (and one ack) per batch, not per
# message, so a burst of broker-made dead letters is recorded at the database's pace.
WATCH_BATCH = 200


def watch_once(
    *, limit: int = 2000, timeout: float = 2.0, connection: Connection | None = None
) -> int:
    """Reconcile up to `limit` messages of `dlq.watch`, spending at most ~`timeout` s.

    1. Passive-declare the queue: nothing waiting costs one round trip.
    2. Take up to WATCH_BATCH messages (basic_get, unacked); decode them and reconcile
       them in one transaction (`_reconcile_batch`: the common case of a burst in a few
       statements for the batch, the rest each in its own savepoint); ack them all (one
       `multiple` ack) only after that commit, so a crash in between redelivers them
       and the repeats change nothing (each message id is recorded with its row).
    3. The database unreachable: requeue what the batch took, stop, and re-raise (the
       dispatcher logs it and tries again next loop); nothing is decided without it.
    Returns the number of messages acked.
    """
    done = 0
    deadline = time.monotonic() + timeout
    needs_sweep: set[str] = set()
    with broker_channel(connection) as channel:
        try:
            if queue_depth(channel, WATCH_QUEUE_NAME) == 0:
                return 0
        except NotFound:
            log.error("dlq_watch_queue_missing", queue=WATCH_QUEUE_NAME)
            return 0
        while done < limit and time.monotonic() < deadline:
            batch: list[Any] = []
            while len(batch) < min(WATCH_BATCH, limit - done):
                message = channel.basic_get(queue=WATCH_QUEUE_NAME, no_ack=False)
                if message is None:
                    break
                batch.append(message)
            if not batch:
                break
            try:
                with transaction.atomic():
                    outcomes = _reconcile_batch([decode_amqp(message) for message in batch])
            except Exception:
                for message in batch:
                    channel.basic_reject(message.delivery_tag, requeue=True)
                raise
            channel.basic_ack(batch[-1].delivery_tag, multiple=True)
            done += len(batch)
            for decoded, outcome in outcomes:
                log.info(
                    "dlq_watch_message",
                    outcome=outcome,
                    job_id=decoded.job_id,
                    queue=decoded.queue,
                    reason=decoded.reason,
                )
                if outcome in SWEEP_AFTER and decoded.dlq:
                    needs_sweep.add(decoded.dlq)
    _sweep(needs_sweep, connection)
    return done


# Outcomes whose `<q>_dlq` copy no longer stands for an open dead letter.
SWEEP_AFTER = frozenset({Outcome.LIVE_LOCK, Outcome.STALE})


def _sweep(queues: set[str], connection: Connection | None) -> None:
    """Ack away the DLQ copies the watcher just found stale (one pass per DLQ, rare)."""
    for queue in sorted(queues):
        try:
            broker_copies_ack_stale(queue=queue, connection=connection)
        except Exception as exc:  # the copies stay until the next pass; nothing is lost
            log.warning("dlq_sweep_failed", queue=queue, error=repr(exc))


def _reconcile_batch(decoded: list[DecodedMessage]) -> list[tuple[DecodedMessage, str]]:
    """Record a batch of watched messages: the common case of a burst all at once
    (`dead_letters_reconcile`, in a savepoint), every other message one by one.

    Should the batch statement fail for anything but an unreachable database, its
    savepoint is rolled back and every message takes the one-by-one path, which
    decides each on its own.
    """
    try:
        with transaction.atomic():
            outcomes = dead_letters_reconcile(messages=decoded)
    except (OperationalError, InterfaceError):
        raise
    except Exception:
        log.exception("dlq_watch_batch_failed", messages=len(decoded))
        outcomes = [None] * len(decoded)
    return [
        (message, outcome) if outcome is not None else _reconcile(message)
        for message, outcome in zip(decoded, outcomes, strict=True)
    ]


def _reconcile(decoded: DecodedMessage) -> tuple[DecodedMessage, str]:
    """Record one watched message (in its own savepoint); only an unreachable database
    fails it, and with it the batch, which goes back to the queue.

    Any other failure (a value the database refuses, a bug) would bring the message back
    at the head of `dlq.watch` forever and block every message behind it: it is kept
    as a row without a job instead, first with what could be read of it, then bare.
    """
    for fallback in (None, _without_job, _bare):
        if fallback is not None:
            fallback(decoded)
        try:
            return decoded, dead_letter_reconcile(message=decoded)
        except (OperationalError, InterfaceError):
            raise
        except Exception:
            log.exception("dlq_watch_reconcile_failed", message_id=decoded.message_id)
    raise RuntimeError(f"dead letter {decoded.message_id} could not be recorded")


def _without_job(decoded: DecodedMessage) -> None:
    decoded.job_id = None
    decoded.decode_error = "reconciliation failed; see the watcher's log"


def _bare(decoded: DecodedMessage) -> None:
    # Only what the columns surely accept; the broker copy in <q>_dlq keeps the rest.
    decoded.headers = {"dropped": "headers could not be stored"}
    decoded.x_death = None
    decoded.body_text = ""


__all__ = ["Outcome", "watch_once"]
