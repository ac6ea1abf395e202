"""job.progress events: each coalesced progress write puts one in the outbox, in its
transaction; the relay routes it by its type; the ERP receives it only when opted in."""

from __future__ import annotations

import time
import uuid

import pytest
from django.conf import settings as django_settings
from django.db import connection
from kombu import Connection, Queue

from jobs.execution.context import JobContext
from jobs.integrations.topology import (
    EVENTS_EXCHANGE,
    PROGRESS_ROUTING_KEY,
    erp_events_queue,
    erp_routing_keys,
)
from jobs.models import EventOutbox
from jobs.processes.erp_bridge import erp_bridge_run
from jobs.processes.events import outbox_relay_once
from jobs.selectors.job_events import PROGRESS_EVENT_FIELDS
from jobs.services import Fence, job_progress_write
from tests.erp_receiver import Receiver
from tests.factories import job_in_state
from tests.processes import free_port

pytestmark = pytest.mark.django_db


def progress_rows(job_id) -> list[dict]:
    rows = EventOutbox.objects.filter(job_id=job_id, payload__type="job.progress")
    return [row.payload for row in rows.order_by("seq")]


def running():
    job = job_in_state("running", worker="w1")
    return job, Fence("w1", job.attempts)


def test_a_progress_write_puts_its_job_progress_event_in_the_outbox():
    job, fence = running()
    job_progress_write(job_id=job.id, fence=fence, percent=40, step="load", message="4 of 10")
    job.refresh_from_db()

    (event,) = progress_rows(job.id)
    assert set(event) == {"event_id", *PROGRESS_EVENT_FIELDS}
    assert event["type"] == "job.progress" and event["job_id"] == str(job.id)
    assert event["progress"] == {"percent": 40, "step": "load", "message": "4 of 10"}
    assert (event["status"], event["attempt"], event["seq"]) == ("running", 1, job.audit_seq)
    assert event["timestamp"].endswith("Z") and event["job_type"] == job.type
    assert "metrics" not in event  # only when a write carries measurements
    row = EventOutbox.objects.get(event_id=event["event_id"])
    assert row.seq == job.audit_seq  # the seq of its `progress` audit entry


def test_a_refused_progress_write_leaves_no_event():
    job, _ = running()
    with pytest.raises(Exception, match="lock"):
        job_progress_write(job_id=job.id, fence=Fence("someone-else", 1), percent=5, step=None,
                           message=None)  # fmt: skip
    assert progress_rows(job.id) == []


def test_progress_events_come_at_the_coalesced_rate_only(settings):
    settings.JOBOPS_PROGRESS_INTERVAL_SECONDS = 3600
    job, fence = running()
    ctx = JobContext(job=job, fence=fence, log=None)
    for percent in range(10, 60, 10):
        ctx.progress(percent, step=f"s{percent}")
    # The first value is written at once, the rest wait for the interval: one event.
    assert [e["progress"]["percent"] for e in progress_rows(job.id)] == [10]

    settings.JOBOPS_PROGRESS_INTERVAL_SECONDS = 0
    ctx.progress(70, step="s70")
    assert [e["progress"]["percent"] for e in progress_rows(job.id)] == [10, 70]


def test_with_events_off_a_progress_write_writes_no_event():
    job, fence = running()
    with connection.cursor() as cursor:
        cursor.execute("SET jobops.events = 'off'")
    try:
        job_progress_write(job_id=job.id, fence=fence, percent=30, step=None, message=None)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET jobops.events")
    assert progress_rows(job.id) == []


# --- routing: the relay, erp.events and the brokerless bridge ------------------------------


def test_the_erp_binding_includes_job_progress_only_when_opted_in(settings):
    assert erp_routing_keys() == ("job.status.changed",)
    assert {b.routing_key for b in erp_events_queue().bindings} == {"job.status.changed"}
    settings.JOBOPS_ERP_EVENTS_PROGRESS = True
    assert {b.routing_key for b in erp_events_queue().bindings} == {
        "job.status.changed",
        "job.progress",
    }


@pytest.mark.usefixtures("broker")
def test_the_relay_routes_a_progress_event_by_its_type():
    name = f"test.progress.{uuid.uuid4().hex[:8]}"
    queue = Queue(name, exchange=EVENTS_EXCHANGE, routing_key=PROGRESS_ROUTING_KEY, durable=False)
    with Connection(django_settings.BROKER_URL, connect_timeout=10) as conn:
        channel = conn.channel()
        queue(channel).declare()
        try:
            job, fence = running()
            job_progress_write(job_id=job.id, fence=fence, percent=55, step="x", message=None)
            outbox_relay_once()
            got, deadline = [], time.monotonic() + 5
            while not got and time.monotonic() < deadline:
                message = queue(channel).get(no_ack=True)
                if message is None:
                    time.sleep(0.02)
                else:
                    got.append(message)
            # Only the progress event: the status changes go out under their own key.
            assert [m.delivery_info["routing_key"] for m in got] == ["job.progress"]
            assert got[0].decode() == progress_rows(job.id)[0]
            assert got[0].properties["message_id"] == progress_rows(job.id)[0]["event_id"]
        finally:
            queue(channel).delete()


@pytest.fixture
def brokerless(settings):
    settings.JOBOPS_BROKER = False
    settings.BROKER_URL = f"amqp://guest:guest@127.0.0.1:{free_port()}//"
    settings.JOBOPS_ERP_BRIDGE_BACKOFF_SECONDS = 0.01


@pytest.mark.usefixtures("brokerless")
@pytest.mark.parametrize("opted_in", [False, True], ids=["default", "opted-in"])
def test_the_brokerless_bridge_posts_progress_events_only_when_opted_in(settings, opted_in):
    settings.JOBOPS_ERP_EVENTS_PROGRESS = opted_in
    job, fence = running()
    job_progress_write(job_id=job.id, fence=fence, percent=20, step=None, message=None)
    with Receiver() as erp:
        settings.JOBOPS_ERP_EVENTS_URL = erp.url
        erp_bridge_run(url=erp.url, idle_timeout=0.3)
    types = [r["body"]["type"] for r in erp.requests]
    expected = ["job.status.changed"] * 3 + (["job.progress"] if opted_in else [])
    assert types == expected
    # Posted or passed over, no row waits: the bridge's claim never stalls on them.
    assert not EventOutbox.objects.filter(job_id=job.id, published_at__isnull=True).exists()
