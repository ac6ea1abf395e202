"""The ERP outbound bridge (docs/architecture.md): `erp.events` -> HTTP POST, at least once.

`manage.py run_erp_bridge` consumes the durable queue `erp.events` (bound to
`events.jobs`) one message at a time (prefetch 1, manual acks) and POSTs each event's
JSON body, unchanged, to `JOBOPS_ERP_EVENTS_URL` with `Idempotency-Key: <event_id>`,
so the receiver can drop a repeat (the relay and this bridge both deliver at least
once). Outcomes:

- 2xx: delivered, ack.
- 5xx, 408, 425, 429, a timeout or a connection error: a temporary failure. The bridge
  waits a backoff (`JOBOPS_ERP_BRIDGE_BACKOFF_SECONDS`, doubling per consecutive
  failure up to `..._CAP_SECONDS`), then requeues the message: RabbitMQ puts it back at
  the head of the queue, so per-job order holds and nothing is lost, and the wait
  keeps an ERP outage from becoming a tight loop.
- any other status (4xx, a redirect) or a message that is not an event: a permanent
  refusal. Retrying cannot help, so the message is parked, with the response status
  and text in its headers, on the durable classic queue `erp.events.parked` (publisher
  confirms; only then acked) for an operator to inspect and re-drive (e.g. with a
  shovel back to `erp.events` once the cause is fixed). If parking fails the message
  is requeued: never dropped.

Without a broker (JOBOPS_BROKER off, docs/smallest-deployment.md) there is no
`erp.events`: the bridge reads the event outbox itself (`erp_outbox_run`), claiming
unpublished rows in `id` order as the relay does (FOR UPDATE SKIP LOCKED, a job's
events in seq order, so several bridges may run), POSTs each one the same way, and
marks the rows it delivered published in the claim's transaction, after their POSTs:
at least once, and the purge prunes them as usual. A temporary failure ends the batch
(the job's later events must not overtake it) and is tried again after the backoff. A
permanent refusal has no queue to be parked on, so the row is parked in place, in the
same transaction: `parked_at`, the status and the start of the response's text on it,
audited `erp_event_parked` on the ops chain, counted `park`
(jobs/services/erp_parked.py). A parked row is not published: the claim skips it,
it holds none of its job's later events, the purge keeps it, and the gauge
`erp_events_parked` counts it until an operator re-drives it (the bridge takes it
again, with the same Idempotency-Key) or discards it with a justification
(`manage.py erp_parked list|redrive|discard`).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import requests  # type: ignore[import-untyped]  # no stubs pinned (types-requests)
import structlog
from amqp.exceptions import NotFound
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from kombu import Consumer, Producer
from kombu.message import Message

from core.broker import broker_connect
from core.logging import log_context
from core.redact import redact_url, redact_urls_in
from jobs.integrations import metrics
from jobs.integrations.topology import (
    ERP_EVENTS_QUEUE_NAME,
    PARKED_QUEUE_NAME,
    erp_events_queue,
    erp_routing_keys,
)
from jobs.processes.events import OutboxRow, outbox_claim, outbox_mark_published
from jobs.services.erp_parked import Refusal, outbox_park

log = structlog.get_logger("jobs.erp_bridge")

# Statuses worth another try; every other non-2xx is a permanent refusal.
RETRYABLE_STATUSES = frozenset({408, 425, 429})
DELIVERED, RETRY, PARK = "delivered", "retry", "park"


def event_post(
    *, session: requests.Session, url: str, body: bytes, event_id: str
) -> tuple[str, int | None, str]:
    """POST one event; returns (outcome, HTTP status or None, a short reason)."""
    try:
        with metrics.external_call("erp_bridge") as call:
            response = session.post(
                url,
                data=body,
                headers={"Content-Type": "application/json", "Idempotency-Key": event_id},
                timeout=settings.JOBOPS_ERP_BRIDGE_TIMEOUT_SECONDS,
                allow_redirects=False,
            )
            call.status = response.status_code
    except requests.RequestException as exc:  # timeout, refused, reset, DNS
        return RETRY, None, redact_urls_in(repr(exc))[:500]
    status = response.status_code
    if 200 <= status < 300:
        return DELIVERED, status, ""
    reason = response.text[:500]
    if status >= 500 or status in RETRYABLE_STATUSES:
        return RETRY, status, reason
    return PARK, status, reason


@dataclass
class ErpBridge:
    """Handles deliveries of `erp.events`; one instance per consumer connection."""

    url: str
    producer: Producer
    stop: threading.Event = field(default_factory=threading.Event)
    session: requests.Session = field(default_factory=requests.Session)
    counts: dict[str, int] = field(default_factory=lambda: {DELIVERED: 0, RETRY: 0, PARK: 0})
    failures_in_a_row: int = 0
    max_messages: int | None = None

    def exhausted(self) -> bool:
        return self.max_messages is not None and sum(self.counts.values()) >= self.max_messages

    def backoff(self) -> float:
        base = settings.JOBOPS_ERP_BRIDGE_BACKOFF_SECONDS
        cap = settings.JOBOPS_ERP_BRIDGE_BACKOFF_CAP_SECONDS
        return float(min(cap, base * 2 ** max(0, self.failures_in_a_row - 1)))

    def on_message(self, message: Message) -> None:
        """1. Decode the event (not an event: park). 2. POST it. 3. Ack, requeue or park."""
        if self.exhausted() or self.stop.is_set():
            # One drain can bring a delivery past the budget (or the stop): hand it back.
            message.requeue()
            return
        event_id, job_id, event = None, None, {}
        try:
            event = json.loads(message.body)
            event_id = str(event["event_id"])
            job_id = event.get("job_id")
        except (ValueError, TypeError, KeyError) as exc:
            self.park(message, status=None, reason=f"not an event: {exc!r}"[:500])
            return
        with log_context(
            event_id=event_id,
            job_id=job_id,
            request_id=event.get("request_id"),
            correlation_id=event.get("correlation_id"),
            routing_key=message.delivery_info.get("routing_key"),
        ):
            outcome, status, reason = event_post(
                session=self.session, url=self.url, body=message.body, event_id=event_id
            )
            if outcome == DELIVERED:
                self.failures_in_a_row = 0
                message.ack()
                self.count(DELIVERED)
                log.info("erp_event_delivered", status=status)
            elif outcome == RETRY:
                self.failures_in_a_row += 1
                delay = self.backoff()
                log.warning("erp_event_retry", status=status, reason=reason, delay=delay)
                self.stop.wait(delay)  # hold the message meanwhile: no tight loop
                message.requeue()
                self.count(RETRY)
            else:
                self.park(message, status=status, reason=reason)

    def park(self, message: Message, *, status: int | None, reason: str) -> None:
        headers = dict(message.headers or {})
        headers.update(
            {"x-erp-status": status, "x-erp-reason": reason, "x-erp-url": redact_url(self.url)}
        )
        try:
            self.producer.publish(
                message.body,
                exchange="",
                routing_key=PARKED_QUEUE_NAME,
                headers=headers,
                content_type=message.content_type or "application/json",
                content_encoding=message.content_encoding or "utf-8",
                message_id=message.properties.get("message_id"),
                delivery_mode=2,
                mandatory=True,
                retry=False,
                confirm_timeout=settings.JOBOPS_PUBLISH_TIMEOUT_SECONDS,
            )
        except Exception as exc:  # cannot park: keep the event in erp.events
            self.failures_in_a_row += 1
            log.error("erp_event_park_failed", error=repr(exc))
            self.stop.wait(self.backoff())
            message.requeue()
            self.count(RETRY)
            return
        message.ack()
        self.count(PARK)
        log.error("erp_event_parked", status=status, reason=reason, queue=PARKED_QUEUE_NAME)

    def count(self, outcome: str) -> None:
        self.counts[outcome] += 1
        metrics.ERP_BRIDGE_DELIVERIES.labels(outcome=outcome).inc()


def erp_bridge_run(
    *,
    url: str | None = None,
    max_messages: int | None = None,
    idle_timeout: float | None = None,
    stop: threading.Event | None = None,
) -> dict[str, int]:
    """Consume `erp.events` until stopped; returns the outcome counts.

    `max_messages` stops after that many deliveries were handled (a requeue counts);
    `idle_timeout` stops once no delivery came for that long (the `--once` mode).
    """
    url = url or settings.JOBOPS_ERP_EVENTS_URL
    if not url:
        raise ImproperlyConfigured("JOBOPS_ERP_EVENTS_URL is not set: nowhere to POST events")
    if not settings.JOBOPS_EVENTS_PUBLISH:
        raise ImproperlyConfigured(
            "JOBOPS_EVENTS_PUBLISH is off: no job event is written, nothing to deliver"
        )
    stop = stop or threading.Event()
    if not settings.JOBOPS_BROKER:
        return erp_outbox_run(
            url=url, max_messages=max_messages, idle_timeout=idle_timeout, stop=stop
        )
    # Its own connection (a long-lived consumer), with confirms for parking.
    with broker_connect(confirm=True) as conn:
        conn.ensure_connection(max_retries=3)
        publish_channel = conn.channel()
        bridge = ErpBridge(
            url=url, producer=Producer(publish_channel), stop=stop, max_messages=max_messages
        )
        consume_channel = conn.channel()
        # auto_declare=False: the queue and its binding belong to setup_topology, which
        # declares them where JOBOPS_ERP_EVENTS_URL is set; a missing queue is an error
        # here, not invented (events published before it existed went nowhere).
        consumer = Consumer(
            consume_channel,
            queues=[erp_events_queue()],
            on_message=bridge.on_message,
            prefetch_count=1,
            auto_declare=False,
        )
        try:
            consumer.consume()
        except NotFound as exc:
            raise ImproperlyConfigured(
                f"the queue {ERP_EVENTS_QUEUE_NAME} does not exist: run manage.py "
                "setup_topology with JOBOPS_ERP_EVENTS_URL set"
            ) from exc
        with consumer:
            log.info("erp_bridge_started", url=redact_url(url))
            last_activity = time.monotonic()
            while not stop.is_set():
                if bridge.exhausted():
                    break
                try:
                    conn.drain_events(timeout=0.2)
                except TimeoutError:
                    if idle_timeout is not None and time.monotonic() - last_activity > idle_timeout:
                        break
                    continue
                last_activity = time.monotonic()
    log.info("erp_bridge_stopped", **bridge.counts)
    return dict(bridge.counts)


# Rows one outbox claim of the bridge takes: their locks are held through their POSTs.
OUTBOX_BATCH = 20
# How long an idle bridge waits before it looks at the outbox again.
OUTBOX_POLL_SECONDS = 0.2


def erp_outbox_deliver(
    *, session: requests.Session, url: str, limit: int, counts: dict[str, int]
) -> tuple[int, bool]:
    """Deliver one claimed batch of outbox rows; returns (rows handled, whether a
    temporary failure ended it).

    1. Claim up to `limit` unpublished rows that are not parked
       (jobs.processes.events.outbox_claim: id order, rows another bridge holds skipped, a job's
       events in seq order).
    2. POST each in order (a job.progress event only where the ERP opted in: else it
       is marked without a POST). Delivered: to be marked. Refused for good: to be parked. A
       temporary failure: stop, so that no later event of its job goes first.
    3. Mark the delivered rows published, park the refused ones (each audited on the
       ops chain: appended last, so that the chain's lock is not held through POSTs),
       and commit.
    """
    delivered: list[int] = []
    refused: list[Refusal] = []
    failed = False
    with transaction.atomic():
        for row in outbox_claim(limit=limit):
            if row.type not in erp_routing_keys():
                # A job.progress event without JOBOPS_ERP_EVENTS_PROGRESS: not the ERP's;
                # marked with the delivered rows, as the broker drops one nobody is bound to.
                delivered.append(row.id)
                continue
            outcome, status, reason = _outbox_post(session=session, url=url, row=row)
            counts[outcome] += 1
            metrics.ERP_BRIDGE_DELIVERIES.labels(outcome=outcome).inc()
            if outcome == RETRY:
                failed = True
                break
            if outcome == DELIVERED:
                delivered.append(row.id)
            else:
                refused.append(Refusal(id=row.id, status=status, text=reason))
        if delivered:
            outbox_mark_published(delivered)
        outbox_park(refusals=refused)
    return len(delivered) + len(refused), failed


def _outbox_post(
    *, session: requests.Session, url: str, row: OutboxRow
) -> tuple[str, int | None, str]:
    with log_context(event_id=row.event_id, job_id=str(row.job_id), routing_key="outbox"):
        outcome, status, reason = event_post(
            session=session, url=url, body=row.body.encode("utf-8"), event_id=row.event_id
        )
        if outcome == DELIVERED:
            log.info("erp_event_delivered", status=status)
        elif outcome == RETRY:
            log.warning("erp_event_retry", status=status, reason=reason)
        else:
            log.error("erp_event_parked", status=status, reason=reason, where="outbox")
    return outcome, status, reason


def erp_outbox_run(
    *,
    url: str,
    max_messages: int | None = None,
    idle_timeout: float | None = None,
    stop: threading.Event | None = None,
) -> dict[str, int]:
    """The bridge without a broker: deliver outbox rows until stopped (or `max_messages`
    were handled, or none came for `idle_timeout` seconds); returns the outcome counts.
    A temporary failure waits the backoff (doubling up to its cap) before the next try."""
    stop = stop or threading.Event()
    session = requests.Session()
    counts = {DELIVERED: 0, RETRY: 0, PARK: 0}
    failures_in_a_row = 0
    last_activity = time.monotonic()
    log.info("erp_bridge_started", url=redact_url(url), source="outbox")
    while not stop.is_set():
        left = None if max_messages is None else max_messages - sum(counts.values())
        if left is not None and left <= 0:
            break
        limit = OUTBOX_BATCH if left is None else min(OUTBOX_BATCH, left)
        handled, failed = erp_outbox_deliver(session=session, url=url, limit=limit, counts=counts)
        if failed:
            failures_in_a_row += 1
            base = settings.JOBOPS_ERP_BRIDGE_BACKOFF_SECONDS
            cap = settings.JOBOPS_ERP_BRIDGE_BACKOFF_CAP_SECONDS
            stop.wait(min(cap, base * 2 ** (failures_in_a_row - 1)))
            last_activity = time.monotonic()
            continue
        failures_in_a_row = 0
        if handled:
            last_activity = time.monotonic()
            continue
        if idle_timeout is not None and time.monotonic() - last_activity > idle_timeout:
            break
        stop.wait(OUTBOX_POLL_SECONDS)
    log.info("erp_bridge_stopped", **counts)
    return counts
