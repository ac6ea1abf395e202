"""The reference handlers of docs/architecture.md, called directly with a stand-in context."""

from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from jobs.domain.errors import (
    JobValidationError,
    NetworkError,
    RateLimitedError,
    TransientExternalError,
)
from jobs.handlers import ai, cam, erp, model, sim
from jobs.services import validate_params
from tests.metric_samples import Moved


def valid(job_type: str, params: dict) -> dict:
    """What a handler receives: the params as the type's schema validated them."""
    return validate_params(job_type, params)


class Ctx:
    def __init__(self):
        self.job_id = uuid.uuid4()
        self.idempotency_key = str(self.job_id)
        self.attempt = 1
        self.job_type = "test"
        self.progress_calls = []
        self.cancel_after = None
        self.artefacts = {}

    def save_artefact(self, kind, name, data, content_type="application/octet-stream"):
        self.artefacts[(kind, name)] = (data, content_type)

    def progress(self, percent, step=None, message=None):
        self.progress_calls.append((percent, step))

    def check_cancel(self):
        from jobs.domain.errors import JobCancelled

        if self.cancel_after is not None and len(self.progress_calls) >= self.cancel_after:
            raise JobCancelled()


def test_ai_counts_words_sentences_and_finds_keywords():
    text = "Pumps fail. Pumps leak when seals wear! Replace seals before pumps fail again."
    out = ai.run(Ctx(), {"text": text})
    assert (out["words"], out["sentences"]) == (13, 3)
    assert out["keywords"][:3] == ["pumps", "fail", "seals"]
    assert "when" not in out["keywords"]


def test_model_fits_a_line_exactly_through_collinear_points():
    ctx = Ctx()
    out = model.run(ctx, {"points": [[0, 1], [1, 3], [2, 5], [3, 7]]})
    assert out["slope"] == pytest.approx(2) and out["intercept"] == pytest.approx(1)
    assert out["r2"] == pytest.approx(1)
    # The result is also its JSON artefact (docs/architecture.md#planning-artefacts).
    (data, content_type) = ctx.artefacts[("result", "test.json")]
    assert content_type == "application/json" and json.loads(data) == out
    with pytest.raises(JobValidationError):
        model.run(Ctx(), {"points": [[1, 1], [1, 2]]})


def test_cam_zig_zag_toolpath_covers_the_pocket():
    out = cam.run(
        Ctx(), valid("cam", {"width": 100, "height": 50, "tool_diameter": 10, "stepover": 0.5})
    )
    # inner 90 x 40, passes 5 mm apart: 9 passes of 90 mm plus 8 steps of 5 mm
    assert out["passes"] == 9 and out["length"] == pytest.approx(9 * 90 + 8 * 5)
    with pytest.raises(JobValidationError):
        cam.run(Ctx(), valid("cam", {"width": 1, "height": 10, "tool_diameter": 6}))


def test_sim_reports_monotonic_progress_and_stops_at_a_cancellation_point():
    ctx = Ctx()
    out = sim.run(ctx, valid("sim", {"steps": 5, "step_seconds": 0, "seed": 3}))
    assert [p for p, _ in ctx.progress_calls] == [20, 40, 60, 80, 100] and out["steps"] == 5
    assert (
        sim.run(Ctx(), valid("sim", {"steps": 5, "step_seconds": 0, "seed": 3})) == out
    )  # deterministic
    from jobs.domain.errors import JobCancelled

    cancelled = Ctx()
    cancelled.cancel_after = 3
    with pytest.raises(JobCancelled):
        sim.run(cancelled, valid("sim", {"steps": 20, "step_seconds": 0}))
    assert len(cancelled.progress_calls) == 3


@pytest.fixture
def erp_server(settings):
    """A local HTTP server answering with the status the test puts in `status`."""
    state = {"status": 200, "requests": []}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state["requests"].append((dict(self.headers), json.loads(body)))
            self.send_response(state["status"])
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings.JOBOPS_ERP_WEBHOOK_URL = f"http://127.0.0.1:{server.server_port}/hook"
    yield state
    server.shutdown()


def test_erp_posts_the_event_with_the_idempotency_key(erp_server):
    ctx = Ctx()
    moved = Moved()
    out = erp.run(ctx, {"event": "order.shipped", "data": {"n": 1}})
    assert moved("external_call_duration_seconds_count", connector="erp", outcome="ok") == 1
    headers, body = erp_server["requests"][0]
    assert headers["Idempotency-Key"] == str(ctx.job_id)
    assert body == {"job_id": str(ctx.job_id), "event": "order.shipped", "data": {"n": 1}}
    assert out["status"] == 200


@pytest.mark.parametrize(
    ("status", "error"),
    [(422, JobValidationError), (429, RateLimitedError), (503, TransientExternalError)],
)
def test_erp_maps_4xx_to_nonretryable_and_5xx_to_retryable(erp_server, status, error):
    erp_server["status"] = status
    moved = Moved()
    with pytest.raises(error) as raised:
        erp.run(Ctx(), {"event": "x"})
    assert raised.value.retryable is (status != 422)
    outcome = "server_error" if status >= 500 else "client_error"
    assert moved("external_call_duration_seconds_count", connector="erp", outcome=outcome) == 1
    assert moved("external_call_duration_seconds_count", connector="erp", outcome="ok") == 0


def test_erp_unreachable_is_a_retryable_network_error(settings):
    settings.JOBOPS_ERP_WEBHOOK_URL = "http://127.0.0.1:1/hook"
    moved = Moved()
    with pytest.raises(NetworkError):
        erp.run(Ctx(), {"event": "x"})
    assert (
        moved("external_call_duration_seconds_count", connector="erp", outcome="connection_error")
        == 1
    )


def test_an_erp_url_credential_never_reaches_the_error_message(settings):
    settings.JOBOPS_ERP_WEBHOOK_URL = "http://user:pw@127.0.0.1:1/hook?token=s3cret-t0ken"
    with pytest.raises(NetworkError) as raised:
        erp.run(Ctx(), {"event": "x"})
    message = str(raised.value)
    assert "/hook?***" in message  # still says where it failed
    assert "s3cret-t0ken" not in message and "pw" not in message.replace("/hook", "")


def test_redaction_of_urls_in_text():
    from core.redact import redact_url, redact_urls_in

    assert redact_url("https://u:p@erp.example:8443/h?token=x") == "https://erp.example:8443/h?***"
    assert redact_url("https://erp.example/h") == "https://erp.example/h"
    text = "Max retries exceeded with url: /hook?token=abc (Caused by https://a:b@h/x?k=v)"
    assert redact_urls_in(text) == (
        "Max retries exceeded with url: /hook?*** (Caused by https://***@h/x?***)"
    )
