"""Webhook delivery (docs/webhooks.md): outbox -> `webhook_deliveries` -> signed POSTs.

**Fan-out.** `webhook_fanout` reads the event outbox after its own cursor (the one row
of `webhook_cursor`), independent of the relay and the ERP bridge, and copies each event
into one `webhook_deliveries` row per endpoint of the job's organisation (and project)
that subscribed to its type; a `failed` status change is a `job.dead_lettered` event
too. The cursor is the position (writing transaction id, row id): a row is read only
once its transaction id is below that of every transaction of this database still
running (HORIZON), so a transaction that commits late cannot slip a row behind the
cursor, as an id alone would let it. The copy and the cursor's move are one
transaction: at least once, and the unique (endpoint, webhook_id) makes a repeat a
no-op. The purge and `outbox_prune` keep outbox rows the cursor has not passed.

**Delivery.** `WebhookRunner.step` hands each endpoint with due deliveries to a thread
of its pool (JOBOPS_WEBHOOK_CONCURRENCY), one thread per endpoint at a time, so a
receiver that hangs holds only its own endpoint, for at most its timeout per POST. The
thread takes the endpoint's advisory lock (one deliverer per endpoint across processes),
then its due deliveries whose job has no earlier undelivered event for this endpoint,
in order, and POSTs each (jobs/integrations/webhook_http.py) with the Standard Webhooks
headers: `webhook-id` (the same for every attempt), a fresh `webhook-timestamp` and
`webhook-signature`. A 2xx delivers; anything else is a failure that holds the job's
later events for this endpoint (never another job's or another endpoint's) until the
next try, after JOBOPS_WEBHOOK_RETRY_SCHEDULE. An endpoint failing for
JOBOPS_WEBHOOK_RETRY_WINDOW without a success is disabled (`webhook_disabled` on the ops
chain); its deliveries wait for it to be enabled. A suspended organisation's deliveries
wait too.
"""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import structlog
from django.conf import settings
from django.db import connection, connections, transaction
from django.utils import timezone

from jobs.integrations import metrics
from jobs.integrations.webhook_http import webhook_post
from jobs.services.webhook_secrets import signatures
from jobs.services.webhooks import (
    DEAD_LETTERED,
    EVENT_TYPES,
    STATUS_CHANGED,
    signing_secrets,
    webhook_disable_failing,
)
from jobs.tables.webhooks import WebhookAttempt, WebhookDelivery, WebhookEndpoint

log = structlog.get_logger("jobs.webhooks")

FANOUT_BATCH = 1000
ATTEMPT_FIELDS = ["attempts", "last_status", "delivered_at", "last_error", "next_attempt_at"]
DELIVERY_BATCH = 50
# The advisory lock class of an endpoint's deliverer (with the endpoint id).
LOCK_CLASS = 0x5742  # "WB"
# A dead-lettered event's webhook-id is derived from its status change's event id.
DEAD_LETTER_NAMESPACE = uuid.UUID("6f0a4a8e-3f59-4f53-9d1a-0c6f7d1f0b41")

CURSOR_ENSURE = (
    "INSERT INTO webhook_cursor (id, last_txid, last_id, updated_at) "
    "VALUES (1, 0, 0, now()) ON CONFLICT DO NOTHING"
)
CURSOR_LOCK = "SELECT last_txid, last_id FROM webhook_cursor WHERE id = 1 FOR UPDATE"
# The horizon: no row of a transaction at or above it may be read yet. The next
# transaction id of this statement's snapshot (any later transaction gets one above it),
# or the oldest transaction of this database still running with an id (read after the
# snapshot: one that ended since is visible to the next statement), whichever is lower.
# This database's only: pg_snapshot_xmin would wait for any transaction of the whole
# cluster. pg_stat_activity shows 32-bit ids: widened with the epoch of the next id (one
# far above it is of the epoch before; one just above it began after the snapshot). It
# shows another role's sessions' ids only to a member of pg_read_all_stats: every
# process that writes jobs runs as the one role of DATABASE_URL.
HORIZON = """
WITH next AS (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS n)
SELECT least(
    (SELECT n FROM next),
    (SELECT min(CASE WHEN full_xid - next.n > 2147483648 THEN full_xid - 4294967296
                     ELSE full_xid END)
     FROM next, LATERAL (
         SELECT ((next.n >> 32) << 32) | a.backend_xid::text::bigint AS full_xid
         FROM pg_stat_activity a
         WHERE a.datname = current_database() AND a.backend_xid IS NOT NULL
           AND a.pid <> pg_backend_pid()
     ) AS running)
)
"""
# Rows after the cursor, below the horizon, in cursor order.
FANOUT_READ = """
SELECT coalesce(o.txid, '0'::xid8)::text::bigint, o.id, o.event_id::text, o.job_id, o.seq,
       o.payload::text, o.payload->>'type', o.payload->>'status',
       o.payload->>'org_id', o.payload->>'project_id'
FROM event_outbox o
WHERE (coalesce(o.txid, '0'::xid8), o.id) > (%(txid)s::text::xid8, %(id)s)
  AND coalesce(o.txid, '0'::xid8) < %(horizon)s::text::xid8
ORDER BY coalesce(o.txid, '0'::xid8), o.id
LIMIT %(limit)s
"""
CURSOR_MOVE = (
    "UPDATE webhook_cursor SET last_txid = %s, last_id = %s, updated_at = now() WHERE id = 1"
)
# Endpoints with a delivery due, enabled, of an organisation not suspended.
DUE_ENDPOINTS = """
SELECT DISTINCT d.endpoint_id
FROM webhook_deliveries d
JOIN webhook_endpoints e ON e.id = d.endpoint_id
JOIN organisations o ON o.id = e.organisation_id
WHERE d.delivered_at IS NULL AND d.next_attempt_at <= now()
  AND e.disabled_at IS NULL AND o.suspended_at IS NULL
"""
# An endpoint's due deliveries, oldest first, but none behind an earlier event of its
# job that waits for a retry (it holds them: they would only take the batch's places),
# nor behind one the fan-out has yet to copy (a transaction that took its id before the
# one of the later event but committed after it).
DUE_DELIVERIES = """
SELECT d.id FROM webhook_deliveries d
WHERE d.endpoint_id = %(endpoint)s AND d.delivered_at IS NULL AND d.next_attempt_at <= now()
  AND NOT EXISTS (
      SELECT FROM webhook_deliveries p
      WHERE p.endpoint_id = d.endpoint_id AND p.job_id = d.job_id
        AND p.delivered_at IS NULL AND p.seq < d.seq AND p.next_attempt_at > now()
  )
  AND NOT EXISTS (
      SELECT FROM event_outbox o
      WHERE o.job_id = d.job_id AND o.seq < d.seq AND webhook_outbox_unread(o.txid, o.id)
  )
ORDER BY d.id
LIMIT %(limit)s
"""
# The undelivered deliveries of these jobs for the endpoint, each job's in seq order.
WAITING_OF_JOBS = """
SELECT id, job_id FROM webhook_deliveries
WHERE endpoint_id = %(endpoint)s AND delivered_at IS NULL AND job_id = ANY(%(jobs)s)
ORDER BY job_id, seq, id
"""
ENDPOINT_ACTIVE = """
SELECT e.id FROM webhook_endpoints e JOIN organisations o ON o.id = e.organisation_id
WHERE e.id = %s AND e.disabled_at IS NULL AND o.suspended_at IS NULL
"""


def webhook_fanout(*, limit: int = FANOUT_BATCH) -> int:
    """Copy the outbox events after the cursor into deliveries, move the cursor; returns
    the deliveries made."""
    return _fanout_batch(limit=limit)[1]


def _fanout_batch(*, limit: int) -> tuple[int, int]:
    """One fan-out transaction; returns (outbox rows read, deliveries made)."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(CURSOR_ENSURE)
            cursor.execute(CURSOR_LOCK)
            last_txid, last_id = cursor.fetchone()
            cursor.execute("SELECT pg_stat_clear_snapshot()")  # pg_stat_activity afresh
            cursor.execute(HORIZON)
            (horizon,) = cursor.fetchone()
            cursor.execute(
                FANOUT_READ,
                {"txid": last_txid, "id": last_id, "horizon": horizon, "limit": limit},
            )
            rows = cursor.fetchall()
        if not rows:
            return 0, 0
        endpoints = _subscriptions()
        now = timezone.now()
        made: list[WebhookDelivery] = []
        for _, _, event_id, job_id, seq, body, kind, status, org_id, project_id in rows:
            for endpoint_id, events, project in endpoints.get(_int(org_id) or 0, ()):
                if project is not None and project != _int(project_id):
                    continue
                for event_type, webhook_id, text in _messages(event_id, kind, status, body):
                    if event_type in events:
                        made.append(
                            WebhookDelivery(
                                endpoint_id=endpoint_id,
                                webhook_id=webhook_id,
                                event_type=event_type,
                                job_id=job_id,
                                seq=seq,
                                body=text,
                                next_attempt_at=now,
                            )
                        )
        if made:
            WebhookDelivery.objects.bulk_create(made, ignore_conflicts=True)
            metrics.WEBHOOK_FANNED_OUT.inc(len(made))
        with connection.cursor() as cursor:
            cursor.execute(CURSOR_MOVE, [rows[-1][0], rows[-1][1]])
    return len(rows), len(made)


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _subscriptions() -> dict[int, list[tuple[int, set[str], int | None]]]:
    """Per organisation: (endpoint id, its event types, its project or None). Disabled
    endpoints too: their queue is kept for when they are enabled again."""
    found: dict[int, list[tuple[int, set[str], int | None]]] = {}
    for pk, org_id, events, project_id in WebhookEndpoint.objects.values_list(
        "id", "organisation_id", "events", "project_id"
    ):
        found.setdefault(org_id, []).append((pk, set(events), project_id))
    return found


def _messages(
    event_id: str, kind: str | None, status: str | None, body: str
) -> list[tuple[str, str, str]]:
    """(event type, webhook-id, body) of each message an outbox event makes."""
    kind = kind or STATUS_CHANGED
    if kind not in EVENT_TYPES:
        return []
    found = [(kind, f"msg_{event_id}", body)]
    if kind == STATUS_CHANGED and status == "failed":
        # A failed job is dead-lettered (docs/architecture.md): its own message type,
        # the same body but for its type, and a webhook-id of its own.
        derived = uuid.uuid5(DEAD_LETTER_NAMESPACE, event_id)
        text = body.replace(f'"type": "{STATUS_CHANGED}"', f'"type": "{DEAD_LETTERED}"', 1)
        found.append((DEAD_LETTERED, f"msg_{derived}", text))
    return found


@dataclass
class Outcome:
    delivered: int = 0
    failed: int = 0


def webhook_deliver_endpoint(endpoint_id: int, *, limit: int = DELIVERY_BATCH) -> Outcome:
    """Deliver one batch of an endpoint's due deliveries (see the module docstring).

    No transaction is held through a POST: a receiver's wait must not keep a transaction
    open (the fan-out's horizon would wait for it, and every endpoint with it). The
    endpoint's session advisory lock keeps a second deliverer off it; each attempt is
    recorded in a transaction of its own, after its POST (a crash in between sends the
    event again, with the same webhook-id). A POST without an answer (a timeout, a refused
    connection) ends the batch: the receiver is down, and the next job's event would only
    wait out the same timeout.
    """
    outcome = Outcome()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [LOCK_CLASS, endpoint_id])
        if not cursor.fetchone()[0]:
            return outcome  # another deliverer has it
    try:
        with connection.cursor() as cursor:
            cursor.execute(ENDPOINT_ACTIVE, [endpoint_id])
            if cursor.fetchone() is None:
                return outcome
            cursor.execute(DUE_DELIVERIES, {"endpoint": endpoint_id, "limit": limit})
            ids = [row[0] for row in cursor.fetchall()]
        endpoint = WebhookEndpoint.objects.get(pk=endpoint_id)
        by_id = WebhookDelivery.objects.in_bulk(ids)
        last_error, answered = "", True
        for run in _runs(endpoint_id, [by_id[pk] for pk in ids]):
            for delivery in run:
                ok, answered, error = _attempt(endpoint, delivery)
                if not ok:
                    outcome.failed += 1
                    last_error = error
                    break  # the job's later events wait for this one
                outcome.delivered += 1
            if not answered:
                break
        if outcome.delivered or outcome.failed:
            with transaction.atomic():
                _endpoint_record(endpoint, outcome, last_error)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [LOCK_CLASS, endpoint_id])
    return outcome


def _runs(endpoint_id: int, due: list[WebhookDelivery]) -> list[list[WebhookDelivery]]:
    """Per job (in the order of its oldest due delivery), the due deliveries that can go
    in a row: from its earliest undelivered one on, up to the first that is not due (or
    not in this batch)."""
    if not due:
        return []
    by_id = {d.id: d for d in due}
    jobs = list(dict.fromkeys(d.job_id for d in due))
    with connection.cursor() as cursor:
        cursor.execute(WAITING_OF_JOBS, {"endpoint": endpoint_id, "jobs": jobs})
        waiting = cursor.fetchall()
    runs: dict[Any, list[WebhookDelivery]] = {job: [] for job in jobs}
    blocked: set[Any] = set()
    for pk, job_id in waiting:
        if job_id in blocked:
            continue
        if pk in by_id:
            runs[job_id].append(by_id[pk])
        else:
            blocked.add(job_id)
    return [runs[job] for job in jobs if runs[job]]


def _attempt(endpoint: WebhookEndpoint, delivery: WebhookDelivery) -> tuple[bool, bool, str]:
    """POST one delivery, then record the attempt and where the delivery stands;
    returns (delivered, answered at all, the error)."""
    now = timezone.now()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "jobops-webhooks",
        "webhook-id": delivery.webhook_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signatures(
            secrets_=signing_secrets(endpoint, now=now),
            webhook_id=delivery.webhook_id,
            timestamp=now,
            body=delivery.body,
        ),
    }
    answer = webhook_post(
        endpoint.url,
        body=delivery.body.encode("utf-8"),
        headers=headers,
        timeout=settings.JOBOPS_WEBHOOK_TIMEOUT_SECONDS,
    )
    ok = answer.status is not None and 200 <= answer.status < 300
    metrics.WEBHOOK_ATTEMPTS.labels(outcome="delivered" if ok else "failed").inc()
    metrics.WEBHOOK_LATENCY.observe(answer.latency_ms / 1000)
    with transaction.atomic():
        WebhookAttempt.objects.create(
            delivery=delivery,
            at=now,
            status=answer.status,
            latency_ms=answer.latency_ms,
            response=answer.text,
        )
        delivery.attempts += 1
        delivery.last_status = answer.status
        if ok:
            delivery.delivered_at = timezone.now()
            delivery.last_error = ""
        else:
            error = f"HTTP {answer.status}: {answer.text}" if answer.status else answer.text
            delivery.last_error = error[:500]
            delivery.next_attempt_at = timezone.now() + retry_delay(delivery.attempts)
        delivery.save(update_fields=ATTEMPT_FIELDS)
    log.info(
        "webhook_attempt",
        endpoint_id=endpoint.id,
        webhook_id=delivery.webhook_id,
        status=answer.status,
        latency_ms=answer.latency_ms,
        delivered=ok,
    )
    return ok, answer.status is not None, delivery.last_error


def retry_delay(attempts: int) -> timedelta:
    """The wait after the `attempts`-th failed attempt: the schedule's, the last repeating."""
    schedule = settings.JOBOPS_WEBHOOK_RETRY_SCHEDULE
    return schedule[min(attempts, len(schedule)) - 1]


def _endpoint_record(endpoint: WebhookEndpoint, outcome: Outcome, last_error: str) -> None:
    """The endpoint's health after a batch; disabled once failing past the window."""
    now = timezone.now()
    if outcome.delivered and not outcome.failed:
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(
            failing_since=None, last_success_at=now
        )
    elif outcome.failed:
        updates: dict[str, Any] = {"last_failure_at": now, "last_error": last_error[:500]}
        if outcome.delivered:
            updates["last_success_at"] = now
        WebhookEndpoint.objects.filter(pk=endpoint.pk, failing_since__isnull=True).update(
            failing_since=now
        )
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(**updates)
        webhook_disable_failing(endpoint_id=endpoint.pk, now=now)


def due_endpoints() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(DUE_ENDPOINTS)
        return [row[0] for row in cursor.fetchall()]


def _deliver_in_thread(endpoint_id: int) -> Outcome:
    try:
        return webhook_deliver_endpoint(endpoint_id)
    except Exception:
        log.exception("webhook_delivery_failed", endpoint_id=endpoint_id)
        return Outcome()
    finally:
        connections.close_all()  # this thread's connection: none left behind


class WebhookRunner:
    """The delivery loop's state: a pool of threads and each endpoint's batch in flight."""

    def __init__(self, concurrency: int | None = None) -> None:
        self.pool = ThreadPoolExecutor(
            max_workers=concurrency or settings.JOBOPS_WEBHOOK_CONCURRENCY,
            thread_name_prefix="webhook",
        )
        self.inflight: dict[int, Future[Outcome]] = {}

    def step(self) -> int:
        """Fan out, then start a batch for each endpoint with deliveries due and none in
        flight; returns the batches started. Does not wait for them."""
        while _fanout_batch(limit=FANOUT_BATCH)[0] >= FANOUT_BATCH:
            pass  # a backlog: read on before delivering
        self.inflight = {k: f for k, f in self.inflight.items() if not f.done()}
        started = 0
        for endpoint_id in due_endpoints():
            if endpoint_id not in self.inflight:
                self.inflight[endpoint_id] = self.pool.submit(_deliver_in_thread, endpoint_id)
                started += 1
        return started

    def wait(self, timeout: float | None = None) -> None:
        for future in list(self.inflight.values()):
            future.result(timeout=timeout)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def run(self, *, stop: threading.Event, poll: float = 0.5) -> None:
        log.info("webhooks_started")
        try:
            while not stop.is_set():
                try:
                    self.step()
                except Exception:
                    log.exception("webhook_step_failed")
                    connection.close()
                stop.wait(poll)
        finally:
            self.close()
            log.info("webhooks_stopped")
