"""One trace per submission: API request -> job publish -> worker run.

Every process here is real (gunicorn, the dispatcher, a Celery worker) and exports over
OTLP/HTTP, configured only by the standard OTEL_* variables, to a small collector this
test runs; the spans it receives must link up parent to child.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from rest_framework.authtoken.models import Token

from jobs.domain.states import Status
from jobs.models import Job
from tests.e2e.live_api import gunicorn_server
from tests.factories import UserFactory
from tests.polling import wait_for
from tests.processes import celery_worker, dispatcher_process, free_port, together
from tests.queues import topology_declare_and_purge

pytestmark = pytest.mark.django_db(transaction=True)


class _Collector(ThreadingHTTPServer):
    spans: list[dict[str, Any]]


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            attrs = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.server.spans.append(  # type: ignore[attr-defined]
                        {
                            "service": attrs.get("service.name"),
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex() or None,
                        }
                    )
        payload = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def collector_server() -> Iterator[_Collector]:
    server = _Collector(("127.0.0.1", free_port()), _Handler)
    server.spans = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


@pytest.fixture(scope="module")
def pipeline(collector_server, django_db_setup, django_db_blocker) -> Iterator[Any]:
    """One worker and one dispatcher exporting to the collector, for both tests (each
    starts its own gunicorn: their web processes differ)."""
    env = _otel_env(collector_server)
    with django_db_blocker.unblock():
        topology_declare_and_purge()
        with together(
            celery_worker(queues=("sim",), env=env, name="tracing"),
            dispatcher_process(env=env, name="tracing-dispatcher"),
        ) as (worker, _dispatcher):
            yield worker


@pytest.fixture
def collector(collector_server: _Collector, pipeline: Any) -> _Collector:
    """The collector, its spans of earlier tests forgotten."""
    collector_server.spans.clear()
    return collector_server


def _otel_env(collector: _Collector) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.server_address[1]}",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }


def _chain(spans: list[dict[str, Any]], leaf: dict[str, Any]) -> list[dict[str, Any]]:
    """The leaf and its ancestors, root last."""
    by_id = {s["span_id"]: s for s in spans}
    chain = [leaf]
    while chain[-1]["parent"] in by_id:
        chain.append(by_id[chain[-1]["parent"]])
    return chain


def _submit_and_trace(collector: _Collector, base: str) -> list[dict[str, Any]]:
    token = Token.objects.create(user=UserFactory()).key
    response = requests.post(
        f"{base}/api/v1/jobs",
        json={"type": "sim", "params": {"steps": 1, "step_seconds": 0}},
        headers={"Authorization": f"Token {token}"},
        timeout=30,
    )
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    wait_for(lambda: Job.objects.get(id=job_id).status == Status.SUCCEEDED, timeout=30)

    def worker_span() -> dict[str, Any] | None:
        return next(
            (s for s in collector.spans if s["service"] == "jobops-worker" and "run" in s["name"]),
            None,
        )

    leaf = wait_for(worker_span, timeout=20)

    def whole() -> list[dict[str, Any]] | None:
        # Each process exports its spans in its own batches: the request's and the
        # publish's may come after the worker's.
        chain = _chain(list(collector.spans), leaf)
        return chain if chain[-1]["name"].startswith("POST") else None

    try:
        return wait_for(whole, timeout=10, what="the worker span's ancestors up to the request")
    except AssertionError:  # a broken chain: the test's assertions say where
        return _chain(list(collector.spans), leaf)


def test_the_worker_span_descends_from_the_api_request(collector, pipeline):
    env = _otel_env(collector)
    with gunicorn_server(workers=1, threads=2, env=env) as base:
        chain = _submit_and_trace(collector, base)
    worker_log = pipeline.log_text()
    # The worker's log lines of this job carry the trace id (core/logging.py).
    assert f"trace_id={chain[0]['trace_id']}" in worker_log or (
        f'"trace_id": "{chain[0]["trace_id"]}"' in worker_log
    ), worker_log[-2000:]
    services = [s["service"] for s in chain]
    names = [s["name"] for s in chain]
    assert services[0] == "jobops-worker" and services[-1] == "jobops-web", chain
    assert "job publish" in names, chain
    assert names[-1].startswith("POST"), chain  # the root: the API request itself
    assert len({s["trace_id"] for s in chain}) == 1


def test_a_publish_left_to_the_dispatcher_still_joins_the_request_trace(collector, settings):
    env = _otel_env(collector)
    # The web process cannot reach the broker: the job waits `pending` for the dispatcher,
    # which publishes it in the trace the request started (traceparent on the job row).
    web_env = {**env, "BROKER_URL": f"amqp://guest:guest@127.0.0.1:{free_port()}//"}
    with gunicorn_server(workers=1, threads=2, env=web_env) as base:
        chain = _submit_and_trace(collector, base)
    publish = next(s for s in chain if s["name"] == "job publish")
    assert publish["service"] == "jobops-dispatcher", chain
    assert chain[0]["service"] == "jobops-worker" and chain[-1]["service"] == "jobops-web"
    assert len({s["trace_id"] for s in chain}) == 1
