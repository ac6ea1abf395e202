"""The event outbox relay (docs/architecture.md) against the real PostgreSQL and RabbitMQ.

A temporary queue bound to `events.jobs` sees exactly what a consumer such as
`erp.events` sees.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection, transaction
from django.utils import timezone
from kombu import Connection, Exchange, Queue

import jobs.processes.events
from jobs.integrations.topology import EVENT_ROUTING_KEY, EVENTS_EXCHANGE
from jobs.models import EventOutbox
from jobs.processes.dispatcher import dispatch_once
from jobs.processes.events import outbox_prune, outbox_relay_once
from jobs.queries import QUERIES
from jobs.services import Fence, job_claim, job_succeed
from tests.factories import job_in_state, make_job
from tests.polling import wait_for
from tests.processes import free_port
from tests.threads import run_in_threads

LIFECYCLE = ["pending", "queued", "running", "succeeded"]


@pytest.fixture
def event_queue(broker):
    """A queue bound to events.jobs for this test; yields a function that drains it."""
    name = f"test.events.{uuid.uuid4().hex[:8]}"
    queue = Queue(name, exchange=EVENTS_EXCHANGE, routing_key=EVENT_ROUTING_KEY, durable=False)
    with Connection(settings.BROKER_URL, connect_timeout=10) as conn:
        channel = conn.channel()
        queue(channel).declare()

        def drain(*, expect: int = 0, timeout: float = 5.0) -> list:
            """Messages in arrival order; waits until `expect` arrived (fails the test if
            they do not within `timeout`), then for a short quiet period."""
            bound = queue(channel)
            got, deadline, quiet_until = [], time.monotonic() + timeout, None
            while True:
                message = bound.get(no_ack=True)
                if message is not None:
                    got.append(message)
                    quiet_until = None
                    continue
                now = time.monotonic()
                if len(got) >= expect:
                    # A short quiet period shows that nothing more is on its way.
                    quiet_until = quiet_until or now + 0.2
                    if now >= quiet_until:
                        return got
                elif now > deadline:
                    raise AssertionError(f"{len(got)} of {expect} events arrived in {timeout}s")
                time.sleep(0.02)

        yield drain
        queue(channel).delete()


def bodies_by_job(messages) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for message in messages:
        body = message.decode()
        out.setdefault(body["job_id"], []).append(body)
    return out


@pytest.mark.django_db
def test_every_transition_arrives_once_in_seq_order_with_the_full_body(event_queue):
    job = job_in_state("succeeded")

    assert outbox_relay_once() == 4
    messages = event_queue(expect=4)

    assert [m.decode()["status"] for m in messages] == LIFECYCLE
    rows = list(EventOutbox.objects.filter(job_id=job.id).order_by("seq"))
    assert all(row.published_at is not None for row in rows)
    for message, row in zip(messages, rows, strict=True):
        body = message.decode()
        assert body == row.payload
        assert message.properties["message_id"] == str(row.event_id) == body["event_id"]
        assert message.delivery_info["routing_key"] == "job.status.changed"
        assert message.properties["delivery_mode"] == 2  # persistent
        assert message.content_type == "application/json"
        assert set(body) == {
            "event_id", "type", "job_id", "job_type", "seq", "status", "previous_status",
            "progress", "attempt", "timestamp", "request_id", "correlation_id", "org_id",
            "project_id",
        }  # fmt: skip
        assert body["type"] == "job.status.changed" and body["job_type"] == "sim"
    seqs = [m.decode()["seq"] for m in messages]
    assert seqs == sorted(seqs) and len(set(seqs)) == 4
    assert [m.decode()["previous_status"] for m in messages] == [None, *LIFECYCLE[:-1]]
    assert messages[-1].decode()["attempt"] == 1
    # Nothing is relayed twice when nothing went wrong.
    assert outbox_relay_once() == 0
    assert event_queue() == []


@pytest.mark.django_db
def test_a_crash_after_publish_before_marking_republishes_the_same_event_ids(
    event_queue, monkeypatch
):
    job = job_in_state("succeeded")

    def crash(ids):
        raise RuntimeError("relay died after the broker confirmed, before marking")

    monkeypatch.setattr(jobs.processes.events, "outbox_mark_published", crash)
    with pytest.raises(RuntimeError, match="relay died"):
        outbox_relay_once()
    first = event_queue(expect=4)
    assert [m.decode()["status"] for m in first] == LIFECYCLE
    assert EventOutbox.objects.filter(job_id=job.id, published_at__isnull=True).count() == 4

    monkeypatch.undo()
    assert outbox_relay_once() == 4
    second = event_queue(expect=4)
    assert [m.properties["message_id"] for m in second] == [
        m.properties["message_id"] for m in first
    ]
    assert EventOutbox.objects.filter(job_id=job.id, published_at__isnull=True).count() == 0


@pytest.mark.django_db(transaction=True)
def test_events_committed_while_the_broker_is_down_wait_and_go_out_later(event_queue, settings):
    job = job_in_state("succeeded")
    reachable = settings.BROKER_URL
    settings.BROKER_URL = f"amqp://guest:guest@127.0.0.1:{free_port()}//"

    with pytest.raises(Exception):  # noqa: B017 - kombu/socket error, whichever it is
        outbox_relay_once()
    assert EventOutbox.objects.filter(job_id=job.id, published_at__isnull=False).count() == 0
    # The dispatcher survives it: the step reports an error and marks nothing.
    report = dispatch_once(steps=[("outbox", "jobs.processes.events.outbox_relay_once")])
    assert "error" in report["outbox"]

    settings.BROKER_URL = reachable
    assert event_queue() == []
    assert dispatch_once(steps=[("outbox", "jobs.processes.events.outbox_relay_once")]) == {
        "outbox": 4
    }
    assert [m.decode()["status"] for m in event_queue(expect=4)] == LIFECYCLE


@pytest.mark.django_db(transaction=True)
def test_concurrent_relays_keep_each_jobs_seq_order_and_lose_nothing(event_queue, monkeypatch):
    jobs_ = [job_in_state("queued") for _ in range(12)]
    # Interleave the jobs' transitions so that one job's rows spread over the id range.
    for job in jobs_:
        job_claim(job_id=job.id, locked_by="w1")
    for job in jobs_:
        job_succeed(job_id=job.id, fence=Fence("w1", 1), result=None)
    expected = EventOutbox.objects.count()
    assert expected == 12 * 4

    # Slow each publish a little so that the relays' claims really overlap.
    real_publish = jobs.processes.events.event_publish

    def slow_publish(**kwargs):
        time.sleep(0.003)
        real_publish(**kwargs)

    monkeypatch.setattr(jobs.processes.events, "event_publish", slow_publish)

    def relay(_: int) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            # Small batches: many claims, each racing the other relays'.
            jobs.processes.events.outbox_relay_batch(limit=8)
            if not EventOutbox.objects.filter(published_at__isnull=True).exists():
                break
            time.sleep(0.001)

    assert run_in_threads(relay, 3) == []
    assert not EventOutbox.objects.filter(published_at__isnull=True).exists()

    received = bodies_by_job(event_queue(expect=expected))
    assert set(received) == {str(j.id) for j in jobs_}
    for job_id, bodies in received.items():
        # At least once: drop repeats as a consumer would, by event_id; what remains is
        # every transition, in seq order.
        seen, firsts = set(), []
        for body in bodies:
            if body["event_id"] not in seen:
                seen.add(body["event_id"])
                firsts.append(body)
        assert [b["status"] for b in firsts] == LIFECYCLE, job_id
        assert [b["seq"] for b in firsts] == sorted(b["seq"] for b in firsts)


@pytest.mark.django_db
def test_a_job_row_waits_while_a_lower_seq_of_its_job_is_unpublished_elsewhere(event_queue):
    """The ordering rule itself: a claim without the job's lowest unpublished seq holds
    its rows back rather than publish seq n+1 before seq n."""
    job = job_in_state("succeeded")
    first = EventOutbox.objects.filter(job_id=job.id).order_by("seq").first()
    rows = list(EventOutbox.objects.filter(job_id=job.id).exclude(id=first.id))
    assert jobs.processes.events._publishable(rows) == []
    assert len(jobs.processes.events._publishable([first, *rows])) == 4


def _claim_buffers() -> int:
    """The buffers the relay's claim reads, from EXPLAIN ANALYZE of that statement run
    where the relay runs it (its transaction, its settings), just before it runs."""
    read: list[int] = []

    def explain(execute, statement, params, many, context):
        if statement == QUERIES["outbox_claim"]:
            cursor = context["cursor"]
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}", params)
            plan = cursor.fetchone()[0][0]["Plan"]
            read.append(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])
        return execute(statement, params, many, context)

    with connection.execute_wrapper(explain):
        assert jobs.processes.events.outbox_relay_batch() == 0
    assert len(read) == 1
    return read[0]


@pytest.mark.django_db(transaction=True)
def test_a_claim_does_not_visit_the_rows_published_before_it():
    """A published row's entry stays in outbox_unpublished_idx until VACUUM. The claim's
    index scan flags such entries dead as it passes them, so that the next claim skips
    them; a bitmap scan flagged nothing and each claim visited every published row."""
    job_id = uuid.uuid4()
    EventOutbox.objects.bulk_create(
        EventOutbox(job_id=job_id, seq=n, payload={"n": n}) for n in range(1, 5001)
    )
    with transaction.atomic():
        EventOutbox.objects.update(published_at=timezone.now())  # as the relay marks them
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_current_xact_id()::text::xid")
            (update_xid,) = cursor.fetchone()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_relation_size('event_outbox') / current_setting('block_size')::int"
        )
        (heap_pages,) = cursor.fetchone()
    # An entry is flagged only once no snapshot can still see its row, and snapshots
    # span the cluster: a transaction that began before the update, in any database
    # (an autovacuum ANALYZE the inserts set off, another test run), keeps the old rows
    # alive until it ends. Wait for none. A bitmap scan flags nothing, however long.
    wait_for(lambda: _snapshots_older_than(update_xid) == 0, what="older snapshots ended")
    _claim_buffers()  # passes the published rows' entries once
    assert _claim_buffers() < heap_pages / 4


def _snapshots_older_than(xid: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
            "AND (age(backend_xmin) >= age(%(xid)s::xid) OR age(backend_xid) >= age(%(xid)s::xid))",
            {"xid": xid},
        )
        return cursor.fetchone()[0]


@pytest.mark.django_db
def test_relay_command_relays_and_prunes(event_queue):
    job = job_in_state("succeeded")
    call_command("relay_outbox", "--once")
    assert len(event_queue(expect=4)) == 4
    EventOutbox.objects.filter(job_id=job.id).update(
        published_at=timezone.now() - timedelta(days=10)
    )
    unpublished = make_job()
    assert outbox_prune(older_than=timedelta(days=7)) == 4
    assert list(EventOutbox.objects.values_list("job_id", flat=True)) == [unpublished.id]
    # Unpublished rows survive any age.
    EventOutbox.objects.update(created_at=timezone.now() - timedelta(days=100))
    assert outbox_prune(older_than=timezone.now()) == 0


@pytest.fixture
def unbound_exchange(broker, monkeypatch):
    """The relay publishes to an exchange of its own with no queue bound to it."""
    nowhere = Exchange(f"test.nowhere.{uuid.uuid4().hex[:6]}", type="topic", durable=False)
    with Connection(settings.BROKER_URL, connect_timeout=10) as conn:
        nowhere(conn.channel()).declare()
        monkeypatch.setattr(jobs.processes.events, "EVENTS_EXCHANGE", nowhere)
        yield
        nowhere(conn.channel()).delete()


@pytest.mark.django_db
def test_with_an_erp_an_unroutable_event_is_an_error_and_nothing_is_marked(
    unbound_exchange, settings
):
    """`mandatory` where an ERP is configured: its queue must get every event, so with
    no queue bound the broker returns the event; the relay must not count the
    (following) ack as a success."""
    settings.JOBOPS_ERP_EVENTS_URL = "http://erp.invalid/events"
    job = make_job()
    with pytest.raises(jobs.processes.events.EventPublishError, match="returned"):
        outbox_relay_once()
    assert EventOutbox.objects.get(job_id=job.id).published_at is None


@pytest.mark.django_db
def test_without_an_erp_an_event_nobody_subscribed_to_is_relayed_and_marked(
    unbound_exchange, settings
):
    """Publish-subscribe: no queue bound means no subscriber, not a fault. The relay
    must not stall on it (the outbox would grow for ever); the row is marked and
    stays in the outbox until it is pruned."""
    settings.JOBOPS_ERP_EVENTS_URL = ""
    job = make_job()
    assert outbox_relay_once() == 1
    assert EventOutbox.objects.get(job_id=job.id).published_at is not None
