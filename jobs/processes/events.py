"""The event outbox relay (docs/architecture.md): outbox rows -> `events.jobs`, at least once.

Every transition writes an `EventOutbox` row in its own transaction
(`jobs.services.transitions`). The relay publishes those rows to the topic exchange
`events.jobs` (routing key: the event's type, `job.status.changed` or `job.progress`;
`message_id = event_id`, persistent,
JSON, publisher confirms; `mandatory` where an ERP receives the event) and marks them
`published_at` only after the broker's confirm, in the transaction that holds the row
locks:

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
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import amqp
import structlog
from amqp import spec
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from core.broker import (
    PublishError,
    broker_connection,
    broker_connection_drop,
    confirm_channel,
)
from jobs.integrations import metrics
from jobs.integrations.topology import EVENTS_EXCHANGE, erp_configured, erp_receives
from jobs.models import EventOutbox
from jobs.queries import QUERIES

log = structlog.get_logger("jobs.events")


class EventPublishError(PublishError):
    """The broker nacked or returned (unroutable) an event, or its confirm timed out."""


@dataclass(frozen=True)
class OutboxRow:
    """A claimed outbox row, its payload as the JSON text the database holds (published
    as it is: no decode and encode per event)."""

    id: int
    job_id: Any
    seq: int
    event_id: str
    body: str
    type: str  # the routing key: job.status.changed or job.progress


def event_publish(*, channel: Any, event: OutboxRow, mandatory: bool) -> None:
    """Send one event on a confirm-mode channel (its confirm is awaited by the caller).

    Persistent, JSON, `message_id = event_id`, headers job_id and seq, routed by its
    type. `mandatory` where an ERP receives events of that type (a job.progress event
    only with JOBOPS_ERP_EVENTS_PROGRESS on): its queue `erp.events` must receive every
    such event, so an
    event that no queue receives (the queue missing) comes back as a basic.return,
    counted as a failure instead of a silent success. Without an ERP, `events.jobs` is
    plain publish-subscribe: a consumer binds a queue of its own to receive events, an
    event nobody subscribed to is dropped by the broker, and the outbox table keeps
    every event until it is pruned.
    """
    message = amqp.Message(
        event.body.encode("utf-8"),
        content_type="application/json",
        content_encoding="utf-8",
        delivery_mode=2,
        message_id=event.event_id,
        application_headers={"job_id": str(event.job_id), "seq": event.seq},
    )
    # basic.publish as py-amqp's `basic_publish` sends it, without the non-blocking read
    # it makes before every message to notice a connection.blocked frame: a syscall and
    # a frame parse per event. `events_publish` makes that read once per batch, and a
    # blocked broker shows as missing confirms (EventPublishError after the timeout).
    channel.send_method(
        spec.Basic.Publish,
        "Bssbb",
        (0, EVENTS_EXCHANGE.name, event.type, mandatory, False),
        message,
    )


def events_publish(*, events: list[OutboxRow]) -> None:
    """Publish a batch of events and wait until the broker confirmed every one.

    1. This thread's connection (one quick connect attempt: the dispatcher loop is the
       retry and must not stall), its confirm-mode channel, kept between batches
       (core.broker.confirm_channel).
    2. Send every event without waiting (in order, on one channel: RabbitMQ keeps that
       order into each queue).
    3. Wait once until each is confirmed; EventPublishError on a nack, a return or
       JOBOPS_PUBLISH_TIMEOUT_SECONDS. A raise means the caller marks nothing; events
       already confirmed go out again later (at least once).
    """
    conn = broker_connection()
    try:
        channel, confirms = confirm_channel(conn)
        _notice_blocked(conn)
        for event in events:
            event_publish(channel=channel, event=event, mandatory=erp_receives(event.type))
            confirms.published()
        try:
            confirms.wait(timeout=settings.JOBOPS_PUBLISH_TIMEOUT_SECONDS)
        except PublishError as exc:
            raise EventPublishError(str(exc)) from exc
        if confirms.nacked or confirms.returned:
            why = [f"nacked: {sorted(confirms.nacked)}"] if confirms.nacked else []
            why += [reason for _, reason in confirms.returned]
            raise EventPublishError("; ".join(why[:5]))
    except Exception:
        broker_connection_drop(conn)  # the channel's state is unknown: start afresh
        raise


def _notice_blocked(conn: Any) -> None:
    """Read what the broker has sent (a connection.blocked frame, late acks) without
    waiting, as py-amqp does before each publish."""
    try:
        conn.connection.drain_events(timeout=0)
    except TimeoutError:
        pass


def outbox_mark_published(ids: list[int]) -> None:
    """Mark rows relayed (or delivered); runs in the claim's transaction, after every
    confirm (every successful POST)."""
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["outbox_mark"], {"ids": ids})  # a binary array


def _publishable(rows: list[OutboxRow]) -> list[OutboxRow]:
    """Drop claimed rows that a lower unpublished seq outside the claim must precede."""
    if not rows:
        return rows
    with connection.cursor() as cursor:
        cursor.execute(
            QUERIES["outbox_blockers"],
            {
                "job_ids": list({r.job_id for r in rows}),
                "ids": [r.id for r in rows],
                "below": max(r.id for r in rows),
            },
        )
        blockers = dict(cursor.fetchall())
    kept: list[OutboxRow] = []
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


# One claim, one confirm wait and one mark per this many events. The wait for the last
# confirms (the broker's fsync) and the claim and mark are fixed costs per batch: at
# 1,000 they held a relay to ~3,500 events/s here, at 5,000 it reaches ~4,300-5,300.
# A batch's row locks are held through its publish (about a second at this size).
RELAY_BATCH = 5000


def outbox_relay_batch(*, limit: int = RELAY_BATCH) -> int:
    """Relay one claimed batch; returns the number of rows published and marked.

    1. In one transaction, claim up to `limit` unpublished rows in `id` order with
       `FOR UPDATE SKIP LOCKED` (rows another relay holds are skipped), each payload as
       the JSON text the database holds.
    2. Keep only rows that no lower-seq unpublished row of their job outside the
       claim precedes (per-job seq order across relays; see the module docstring).
    3. Publish the kept rows and wait once for every confirm (an exception rolls back:
       nothing marked).
    4. Mark the published rows `published_at` in one statement, then commit.
    """
    with transaction.atomic():
        rows = outbox_claim(limit=limit)
        if not rows:
            return 0
        events_publish(events=rows)
        outbox_mark_published([row.id for row in rows])
    return len(rows)


def outbox_claim(*, limit: int) -> list[OutboxRow]:
    """Claim up to `limit` unpublished rows in `id` order (FOR UPDATE SKIP LOCKED, in the
    caller's transaction), keeping only those no lower seq of their job outside the
    claim must precede: the relay's claim, and the ERP bridge's without a broker. Rows
    parked by that bridge (jobs/services/erp_parked.py) are neither claimed nor wait
    for: they are an operator's to re-drive."""
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["outbox_claim_plan"])
        cursor.execute(QUERIES["outbox_claim"], {"limit": limit})
        return _publishable([OutboxRow(*row) for row in cursor.fetchall()])


def outbox_settle_once(*, limit: int = RELAY_BATCH) -> int:
    """The outbox step without a broker (settings.JOBOPS_BROKERLESS_STEPS); returns the
    rows it marked.

    Where an ERP is configured its bridge reads the outbox itself and marks each row it
    delivered (jobs/processes/erp_bridge.py): nothing to do here, and a row waits for it however
    long the ERP is down. Elsewhere nobody can receive an event (there is no exchange to
    subscribe to), as when the broker drops an event nobody subscribed to: the rows are
    marked published, so that the outbox gauges stay honest and the purge removes them
    after their retention, as it does relayed ones.
    """
    if erp_configured():
        return 0
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(QUERIES["outbox_claim_plan"])
            cursor.execute(QUERIES["outbox_claim"], {"limit": limit})
            ids = [row[0] for row in cursor.fetchall()]
        if ids:
            outbox_mark_published(ids)
    return len(ids)


def outbox_relay_once(*, limit: int = 100_000, seconds: float = 1.0) -> int:
    """Relay unpublished events until none is left, `limit` rows went out or `seconds`
    passed (the dispatcher calls this every loop and has other steps to run).

    A batch can stop early when rows wait for a lower seq held by another relay; those
    go out in a later run. Broker errors propagate (the dispatcher logs them); nothing
    is marked for an unconfirmed event.
    """
    total = 0
    deadline = time.monotonic() + seconds
    while total < limit and time.monotonic() < deadline:
        relayed = outbox_relay_batch(limit=min(RELAY_BATCH, limit - total))
        if relayed == 0:
            break
        total += relayed
        metrics.OUTBOX_RELAYED.inc(relayed)
    if total:
        log.info("outbox_relayed", events=total)
    return total


def outbox_prune(*, older_than: timedelta | datetime) -> int:
    """Delete relayed rows published before `older_than` (an age or a moment).

    Unpublished rows are never deleted, whatever their age, parked ones included.
    Returns the count.
    """
    cutoff = timezone.now() - older_than if isinstance(older_than, timedelta) else older_than
    # Nor a row the webhook fan-out has yet to copy (jobs/processes/webhooks.py).
    deleted, _ = (
        EventOutbox.objects.filter(published_at__isnull=False, published_at__lt=cutoff)
        .extra(where=["NOT webhook_outbox_unread(txid, id)"])
        .delete()
    )
    return deleted
