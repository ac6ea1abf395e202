"""The ERP outbound bridge (DESIGN.md 3.8): erp.events -> HTTP POST with Idempotency-Key.

Real RabbitMQ (the events get there through the real outbox relay) and a real HTTP
server on 127.0.0.1 that answers with scripted statuses and records every request.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from kombu import Connection

from jobs.erp_bridge import erp_bridge_run, erp_bridge_status
from jobs.events import outbox_relay_once
from jobs.models import EventOutbox
from jobs.topology import PARKED_QUEUE_NAME, parked_queue
from tests.factories import make_job
from tests.jobs.test_events import LIFECYCLE, closed_port, run_lifecycle

pytestmark = pytest.mark.django_db


class Receiver:
    """An ERP stand-in: answers `script` statuses in turn (then 200), records requests."""

    def __init__(self, script: list[int | tuple[str, float]] | None = None) -> None:
        self.script = list(script or [])
        self.requests: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "body": json.loads(body)}
                )
                action = receiver.script.pop(0) if receiver.script else 200
                if isinstance(action, tuple):  # ("sleep", seconds): outlive the timeout
                    time.sleep(action[1])
                    action = 200
                self.send_response(action)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(json.dumps({"status": action}).encode())

            def log_message(self, *args):  # keep test output quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/erp/events"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def erp_queues(broker, settings):
    """Topology declared, erp.events and the parked queue empty; fast bridge timings."""
    settings.JOBOPS_ERP_BRIDGE_BACKOFF_SECONDS = 0.05
    settings.JOBOPS_ERP_BRIDGE_BACKOFF_CAP_SECONDS = 0.2
    settings.JOBOPS_ERP_BRIDGE_TIMEOUT_SECONDS = 0.5
    with Connection(django_settings.BROKER_URL, connect_timeout=10) as conn:
        parked_queue()(conn.channel()).declare()
        parked_queue()(conn.channel()).purge()
    yield
    with Connection(django_settings.BROKER_URL, connect_timeout=10) as conn:
        parked_queue()(conn.channel()).purge()


def relayed_job_events(transitions: bool = True) -> list[dict]:
    """A job's events, relayed to events.jobs (and so into erp.events), in seq order."""
    job = make_job()
    if transitions:
        run_lifecycle(job)
    outbox_relay_once()
    return [row.payload for row in EventOutbox.objects.filter(job_id=job.id).order_by("seq")]


def test_each_event_is_posted_once_with_its_event_id_as_idempotency_key(erp_queues):
    events = relayed_job_events()
    with Receiver() as erp:
        call_command("run_erp_bridge", "--once", "--idle", "0.5", "--url", erp.url)

    assert [r["body"] for r in erp.requests] == events  # all, in seq order, unchanged
    assert [r["body"]["status"] for r in erp.requests] == LIFECYCLE
    for request in erp.requests:
        assert request["path"] == "/erp/events"
        assert request["headers"]["Idempotency-Key"] == request["body"]["event_id"]
        assert request["headers"]["Content-Type"] == "application/json"
    assert erp_bridge_status() == {"erp.events": 0, PARKED_QUEUE_NAME: 0}


def test_a_server_error_then_success_is_retried_and_delivered_once_acked(erp_queues):
    (event,) = relayed_job_events(transitions=False)
    with Receiver(script=[500, 503, ("sleep", 1.0)]) as erp:
        counts = erp_bridge_run(url=erp.url, idle_timeout=1.5)

    # 500, 503, a timeout (0.5 s), then 200: the same event each time, same key.
    assert len(erp.requests) == 4
    assert {r["headers"]["Idempotency-Key"] for r in erp.requests} == {event["event_id"]}
    assert counts == {"delivered": 1, "retry": 3, "park": 0}
    assert erp_bridge_status() == {"erp.events": 0, PARKED_QUEUE_NAME: 0}


def test_an_unreachable_receiver_keeps_the_event_queued(erp_queues):
    relayed_job_events(transitions=False)
    started = time.monotonic()
    counts = erp_bridge_run(url=f"http://127.0.0.1:{closed_port()}/x", max_messages=3)
    assert counts == {"delivered": 0, "retry": 3, "park": 0}
    # Backoff between attempts (0.05, 0.1, 0.2 s): no tight loop.
    assert time.monotonic() - started >= 0.3
    assert erp_bridge_status()["erp.events"] == 1  # requeued, not lost


def test_a_client_error_is_parked_not_retried(erp_queues):
    (event,) = relayed_job_events(transitions=False)
    with Receiver(script=[400]) as erp:
        # A credential in the URL's query never reaches the parked message's headers.
        counts = erp_bridge_run(url=erp.url + "?token=s3cret", idle_timeout=1.0)

    assert len(erp.requests) == 1  # no loop on a permanent refusal
    assert counts == {"delivered": 0, "retry": 0, "park": 1}
    assert erp_bridge_status() == {"erp.events": 0, PARKED_QUEUE_NAME: 1}
    with Connection(django_settings.BROKER_URL, connect_timeout=10) as conn:
        parked = parked_queue()(conn.channel()).get(no_ack=True)
    assert json.loads(parked.body) == event
    assert parked.properties["message_id"] == event["event_id"]
    assert parked.headers["x-erp-status"] == 400
    assert parked.headers["x-erp-url"] == erp.url + "?***"
