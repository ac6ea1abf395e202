"""The ERP outbound bridge (docs/architecture.md): erp.events -> HTTP POST with Idempotency-Key.

Real RabbitMQ (the events get there through the real outbox relay) and a real HTTP
server on 127.0.0.1 that answers with scripted statuses and records every request.
"""

from __future__ import annotations

import json
import time

import pytest
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from kombu import Connection

from core.broker import queue_depths
from jobs.integrations.topology import ERP_EVENTS_QUEUE_NAME, PARKED_QUEUE_NAME, parked_queue
from jobs.models import EventOutbox
from jobs.processes.erp_bridge import erp_bridge_run
from jobs.processes.events import outbox_relay_once
from tests.erp_receiver import Receiver
from tests.factories import job_in_state
from tests.metric_samples import Moved
from tests.processes import free_port, run_manage

pytestmark = pytest.mark.django_db


def bridge_depths() -> dict[str, int | None]:
    """Messages ready in erp.events and in the bridge's parked queue, read from the broker."""
    return queue_depths([ERP_EVENTS_QUEUE_NAME, PARKED_QUEUE_NAME])


def relayed_job_events(status: str = "succeeded") -> list[dict]:
    """The events of a job in `status`, relayed to events.jobs (and so into erp.events),
    in seq order."""
    job = job_in_state(status)
    outbox_relay_once()
    return [row.payload for row in EventOutbox.objects.filter(job_id=job.id).order_by("seq")]


def test_each_event_is_posted_once_with_its_event_id_as_idempotency_key(erp_queues):
    events = relayed_job_events()
    with Receiver() as erp:
        call_command("run_erp_bridge", "--once", "--idle", "0.5", "--url", erp.url)

    assert [r["body"] for r in erp.requests] == events  # all, in seq order, unchanged
    assert [r["body"]["status"] for r in erp.requests] == [
        "pending",
        "queued",
        "running",
        "succeeded",
    ]
    for request in erp.requests:
        assert request["path"] == "/erp/events"
        assert request["headers"]["Idempotency-Key"] == request["body"]["event_id"]
        assert request["headers"]["Content-Type"] == "application/json"
    assert bridge_depths() == {"erp.events": 0, PARKED_QUEUE_NAME: 0}


def test_a_server_error_then_success_is_retried_and_delivered_once_acked(erp_queues):
    (event,) = relayed_job_events("pending")
    moved = Moved()
    with Receiver(script=[500, 503, ("sleep", 1.0)]) as erp:
        counts = erp_bridge_run(url=erp.url, idle_timeout=1.5)
    # Each call timed by how it went (external_call_duration_seconds).
    name = "external_call_duration_seconds_count"
    timed = {
        outcome: moved(name, connector="erp_bridge", outcome=outcome)
        for outcome in ("server_error", "timeout", "ok")
    }
    assert timed == {"server_error": 2, "timeout": 1, "ok": 1}

    # 500, 503, a timeout (0.5 s), then 200: the same event each time, same key.
    assert len(erp.requests) == 4
    assert {r["headers"]["Idempotency-Key"] for r in erp.requests} == {event["event_id"]}
    assert counts == {"delivered": 1, "retry": 3, "park": 0}
    assert bridge_depths() == {"erp.events": 0, PARKED_QUEUE_NAME: 0}


def test_an_unreachable_receiver_keeps_the_event_queued(erp_queues):
    relayed_job_events("pending")
    started = time.monotonic()
    counts = erp_bridge_run(url=f"http://127.0.0.1:{free_port()}/x", max_messages=3)
    assert counts == {"delivered": 0, "retry": 3, "park": 0}
    # Backoff between attempts (0.05, 0.1, 0.2 s): no tight loop.
    assert time.monotonic() - started >= 0.3
    assert bridge_depths()["erp.events"] == 1  # requeued, not lost


def test_a_client_error_is_parked_not_retried(erp_queues):
    (event,) = relayed_job_events("pending")
    with Receiver(script=[400]) as erp:
        # A credential in the URL's query never reaches the parked message's headers.
        counts = erp_bridge_run(url=erp.url + "?token=s3cret", idle_timeout=1.0)

    assert len(erp.requests) == 1  # no loop on a permanent refusal
    assert counts == {"delivered": 0, "retry": 0, "park": 1}
    assert bridge_depths() == {"erp.events": 0, PARKED_QUEUE_NAME: 1}
    with Connection(django_settings.BROKER_URL, connect_timeout=10) as conn:
        parked = parked_queue()(conn.channel()).get(no_ack=True)
    assert json.loads(parked.body) == event
    assert parked.properties["message_id"] == event["event_id"]
    assert parked.headers["x-erp-status"] == 400
    assert parked.headers["x-erp-url"] == erp.url + "?***"


def test_the_bridge_refuses_to_start_without_its_queue(broker):
    """setup_topology declares erp.events only where an ERP is configured; a bridge
    started against a broker without it says so instead of failing on a 404."""
    with Connection(django_settings.BROKER_URL, connect_timeout=10) as conn:
        conn.channel().queue_delete(ERP_EVENTS_QUEUE_NAME)
    with pytest.raises(ImproperlyConfigured, match="setup_topology with JOBOPS_ERP_EVENTS_URL"):
        erp_bridge_run(url="http://127.0.0.1:9/erp/events", idle_timeout=0.1)
    # The command an operator types says it in one line, without a traceback.
    result = run_manage("run_erp_bridge", "--once", "--url", "http://127.0.0.1:9/erp/events")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "erp.events does not exist: run manage.py setup_topology" in result.stderr
