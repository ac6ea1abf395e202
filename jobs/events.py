"""The event outbox relay (DESIGN.md 3.8): outbox rows -> `events.jobs`, at least once.

Every transition writes an `EventOutbox` row in its own transaction
(`jobs.services._audit_and_emit`). The relay publishes those rows to the topic exchange
`events.jobs` (routing key `job.status.changed`, `message_id = event_id`, persistent,
JSON, publisher confirms, `mandatory`) and marks them `published_at` only after the
broker's confirm, in the transaction that holds the row locks:

- a crash after the transition's commit and before the publish loses nothing: the row
  waits for the next relay run;
- a crash after the publish and before the mark rolls the mark back: the next run
  publishes the row again with the SAME `event_id` (at least once; consumers drop an
  `event_id` or a per-job `seq` they have already seen).

Several relays (one per dispatcher host) run at once. Rows are claimed with
`FOR UPDATE SKIP LOCKED`, so two relays never publish the same row at the same time.
Per-job `seq` order needs one more rule, because SKIP LOCKED alone would let relay B
take a job's seq 3 while relay A still holds its seq 2: **a relay publishes a row only
if no lower-seq unpublished row of the same job exists outside its own claim.** Such a
row is either in flight in another relay (B waits for A's commit and takes seq 3 in a
later run, after seq 2's confirm) or simply not claimed yet; either way the higher row
stays unpublished and unlocked-after-commit for a later run. Inside one claim a job's
rows are published in `id` order, which is its `seq` order: a job's transitions are
serialised by its row lock and each inserts its outbox row before it commits.
Independent jobs still relay in parallel, which a relay-wide advisory lock would not
allow.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import structlog
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from kombu import Producer

from core.broker import broker_connection, broker_connection_drop, channel_close_quietly
from jobs import metrics, sql
from jobs.models import EventOutbox
from jobs.topology import EVENT_ROUTING_KEY, EVENTS_EXCHANGE

log = structlog.get_logger("jobs.events")


class EventPublishError(Exception):
    """The broker nacked or returned (unroutable) an event, or its confirm timed out."""


def event_publish(*, producer: Producer, payload: dict[str, Any]) -> None:
    """Send one event on a confirm-mode channel (its confirm is awaited by the caller).

    `mandatory`: an event that no queue receives (topology missing) comes back as a
    basic.return, counted as a failure instead of a silent success.
    """
    producer.publish(
        payload,
        exchange=EVENTS_EXCHANGE,
        routing_key=EVENT_ROUTING_KEY,
        serializer="json",
        delivery_mode=2,  # persistent
        mandatory=True,
        message_id=payload["event_id"],
        headers={"job_id": payload["job_id"], "seq": payload["seq"]},
        retry=False,
        declare=[],  # topology belongs to setup_topology
        timeout=settings.JOBOPS_PUBLISH_TIMEOUT_SECONDS,
    )


@dataclass
class _Confirms:
    """Publisher confirms of one channel: delivery tags 1, 2, ... in publish order."""

    sent: int = 0
    pending: set[int] = field(default_factory=set)
    failures: list[str] = field(default_factory=list)

    def on_sent(self) -> None:
        self.sent += 1
        self.pending.add(self.sent)

    def _settle(self, tag: int, multiple: bool) -> set[int]:
        settled = {t for t in self.pending if t <= tag} if multiple else {tag} & self.pending
        self.pending -= settled
        return settled

    def on_ack(self, tag: int, multiple: bool) -> None:
        self._settle(tag, multiple)

    def on_nack(self, tag: int, multiple: bool) -> None:
        self.failures.append(f"nacked: {sorted(self._settle(tag, multiple))}")

    def on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        # A return precedes the message's ack; the ack alone would look like success.
        self.failures.append(f"returned by {exchange}/{routing_key}: {exc}")


def events_publish(*, payloads: list[dict[str, Any]]) -> None:
    """Publish a batch of events and wait until the broker confirmed every one.

    1. Connect (one quick attempt: the dispatcher loop is the retry and must not
       stall) and open a channel in confirm mode.
    2. Send every event without waiting (in order, on one channel: RabbitMQ keeps
       that order into each queue).
    3. Drain until each delivery tag is acked, or raise EventPublishError on a nack,
       a return or JOBOPS_PUBLISH_TIMEOUT_SECONDS. A raise means the caller marks
       nothing; events already confirmed go out again later (at least once).
    """
    timeout = settings.JOBOPS_PUBLISH_TIMEOUT_SECONDS
    # Not kombu's confirm_publish mode, which waits for each message's confirm in turn
    # (one round trip per event): confirms are selected on this channel and awaited
    # once for the whole batch.
    conn = broker_connection()
    try:
        channel = conn.channel()
    except Exception:
        broker_connection_drop(conn)
        raise
    confirms = _Confirms()
    try:
        channel.events["basic_ack"].add(confirms.on_ack)
        channel.events["basic_nack"].add(confirms.on_nack)
        channel.events["basic_return"].add(confirms.on_return)
        channel.confirm_select()
        producer = Producer(channel, auto_declare=False)
        for payload in payloads:
            event_publish(producer=producer, payload=payload)
            confirms.on_sent()
        deadline = time.monotonic() + timeout
        while confirms.pending and not confirms.failures:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = len(confirms.pending)
                raise EventPublishError(f"{missing} confirms missing after {timeout} s")
            conn.drain_events(timeout=remaining)
        if confirms.failures:
            raise EventPublishError("; ".join(confirms.failures[:5]))
    except Exception:
        broker_connection_drop(conn)  # the channel's state is unknown: start afresh
        raise
    channel_close_quietly(channel)  # the events are confirmed; a failing close changes nothing


def _mark_published(ids: list[int]) -> None:
    """Mark rows relayed; runs in the claim's transaction, after every confirm."""
    EventOutbox.objects.filter(id__in=ids).update(published_at=timezone.now())


def _publishable(rows: list[EventOutbox]) -> list[EventOutbox]:
    """Drop claimed rows that a lower unpublished seq outside the claim must precede."""
    if not rows:
        return rows
    with connection.cursor() as cursor:
        cursor.execute(
            sql.OUTBOX_BLOCKERS,
            {"job_ids": list({r.job_id for r in rows}), "ids": [r.id for r in rows]},
        )
        blockers = dict(cursor.fetchall())
    kept: list[EventOutbox] = []
    held: dict[Any, int] = defaultdict(int)
    for row in rows:
        floor = blockers.get(row.job_id)
        if floor is not None and row.seq > floor:
            held[row.job_id] += 1
            continue
        kept.append(row)
    if held:
        log.debug("outbox_rows_held_for_order", jobs=len(held), rows=sum(held.values()))
    return kept


def outbox_relay_batch(*, limit: int = 500) -> int:
    """Relay one claimed batch; returns the number of rows published and marked.

    1. In one transaction, claim up to `limit` unpublished rows in `id` order with
       `FOR UPDATE SKIP LOCKED` (rows another relay holds are skipped).
    2. Keep only rows that no lower-seq unpublished row of their job outside the
       claim precedes (per-job seq order across relays; see the module docstring).
    3. Publish the kept rows and wait for every confirm (an exception rolls back:
       nothing marked).
    4. Mark the published rows `published_at`, then commit (releasing the locks).
    """
    with transaction.atomic():
        claim = (
            EventOutbox.objects.select_for_update(skip_locked=True)
            .filter(published_at__isnull=True)
            .order_by("id")
        )
        rows = _publishable(list(claim[:limit]))
        if not rows:
            return 0
        events_publish(payloads=[row.payload for row in rows])
        _mark_published([row.id for row in rows])
    return len(rows)


def outbox_relay_once(*, limit: int = 1000) -> int:
    """Relay unpublished events until none is left or `limit` rows went out.

    The dispatcher calls this every loop. A batch can stop early when rows wait for
    a lower seq held by another relay; those go out in a later run. Broker errors
    propagate (the dispatcher logs them); nothing is marked for an unconfirmed event.
    """
    total = 0
    while total < limit:
        relayed = outbox_relay_batch(limit=min(100, limit - total))
        if relayed == 0:
            break
        total += relayed
        metrics.OUTBOX_RELAYED.inc(relayed)
    if total:
        log.info("outbox_relayed", events=total)
    return total


def outbox_prune(*, older_than: timedelta | datetime) -> int:
    """Delete relayed rows published before `older_than` (an age or a moment).

    Unpublished rows are never deleted, whatever their age. Returns the count.
    """
    cutoff = timezone.now() - older_than if isinstance(older_than, timedelta) else older_than
    deleted, _ = EventOutbox.objects.filter(
        published_at__isnull=False, published_at__lt=cutoff
    ).delete()
    return deleted
