"""Observability base: /metrics behind a token, masked structured logs,
gauges derived from real rows."""

from __future__ import annotations

import io
import json
import logging
import socket
from datetime import timedelta

import pytest
import structlog
from django.utils import timezone

from audit.models import AuditCheckpoint
from core.logging import MASK, bind_request_context, clear_request_context, formatter, log_context
from core.metrics import metrics_serve
from jobs.integrations import metrics
from jobs.integrations.metrics import metrics_refresh_gauges
from jobs.models import DeadLetter, EventOutbox, Job
from jobs.processes.events import outbox_relay_once
from tests.factories import backdate, job_in_state, make_job, otp_login, role_user

TOKEN = "metrics-token-for-tests-0123456789"


# --- /metrics ---------------------------------------------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize(
    "header",
    [None, "Bearer wrong-token", f"Token {TOKEN}", f"Bearer {TOKEN}x", TOKEN, "Bearer "],
)
def test_metrics_refuses_a_missing_or_wrong_token(client, settings, header):
    settings.METRICS_TOKEN = TOKEN
    extra = {"HTTP_AUTHORIZATION": header} if header is not None else {}
    response = client.get("/metrics", **extra)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert response.json()["error"]["code"] == "ERR-METRICS-401"
    assert b"job_create_total" not in response.content


@pytest.mark.django_db
def test_metrics_serves_with_the_token(client, settings):
    settings.METRICS_TOKEN = TOKEN
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    for name in (
        "job_create_total",
        "job_duration_seconds",
        "retries_total",
        "dlq_replay_total",
        "cancellation_total",
        "progress_update_total",
        "job_oldest_pending_age_seconds",
        "job_stale_locks",
        "outbox_lag_seconds",
        "audit_checkpoint_age_seconds",
        "audit_verification_last_success_timestamp_seconds",
        # The async jobs names (docs/operations/observability.md#metrics).
        "jobs_enqueued_total",
        "jobs_started_total",
        "jobs_succeeded_total",
        "jobs_failed_total",
        "jobs_duration_seconds",
        "jobs_attempts",
        "deadletter_total",
        "s3_operation_duration_seconds",
        "s3_operation_errors_total",
        "django_http_requests_total_by_method",  # django-prometheus' own
    ):
        assert f"# TYPE {name.removesuffix('_total')}" in text or f"# TYPE {name}" in text, name


@pytest.mark.django_db
def test_metrics_are_open_without_a_configured_token(client, settings):
    settings.METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 200


def test_a_metrics_port_in_use_is_a_warning_not_an_error(settings, json_log_lines):
    # A worker group or dispatcher raised here and exited; its supervisor restarted it
    # every 30 s, so no job was published while another process held the port.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        settings.JOBOPS_METRICS_PORT = holder.getsockname()[1]
        settings.JOBOPS_METRICS_ADDR = "127.0.0.1"
        assert metrics_serve() is None
    (line,) = [x for x in json_log_lines() if x["event"] == "metrics_exporter_unavailable"]
    assert line["level"] == "warning"
    assert (
        line["port"] == settings.JOBOPS_METRICS_PORT and "Address already in use" in line["error"]
    )


# --- gauges from the database -----------------------------------------------------------
@pytest.mark.django_db
def test_gauges_are_computed_from_real_rows(client, settings):
    settings.METRICS_TOKEN = ""
    settings.JOBOPS_LOCK_TIMEOUT = 60
    now = timezone.now()
    empty = metrics_refresh_gauges()
    assert empty == {
        "oldest_pending_age": 0.0,
        "stale_locks": 0.0,
        "outbox_lag": 0.0,
        "outbox_unpublished": 0.0,
        "checkpoint_age": -1.0,
        "erp_events_parked": 0.0,
        "queues_paused": 0.0,
        "audit_future_partitions": 3.0,
        # No verification run recorded yet (audit/verification_runs.py).
        "audit_verified_full": 0.0,
        "audit_verified_incremental": 0.0,
    }

    old_pending = make_job()
    Job.objects.filter(id=old_pending.id).update(created_at=now - timedelta(seconds=300))
    make_job()  # a fresh pending job does not lower the oldest age
    stale = job_in_state("running", worker="w1")
    backdate(stale, locked_at=120)
    job_in_state("running", worker="w2")  # a live lock
    EventOutbox.objects.filter(job_id=old_pending.id).update(created_at=now - timedelta(seconds=90))
    AuditCheckpoint.objects.create(
        created_at=now - timedelta(seconds=45),
        last_audit_id=0,
        payload="{}",
        prev_hash="0" * 64,
        checkpoint_hash="1" * 64,
        key_id="k1",
        signature="2" * 64,
    )
    DeadLetter.objects.create(queue="sim_dlq", reason="rejected", body="x")

    values = metrics_refresh_gauges()
    assert 299 <= values["oldest_pending_age"] < 330
    assert values["stale_locks"] == 1
    assert 89 <= values["outbox_lag"] < 120
    # One `created` event per job, and `queued`, `started` of each running one.
    assert values["outbox_unpublished"] == 8
    assert 44 <= values["checkpoint_age"] < 75

    text = client.get("/metrics").content.decode()
    assert "job_stale_locks 1.0" in text
    assert 'dead_letters_open{queue="sim_dlq"} 1.0' in text
    assert 'dead_letters_open{queue="cam_dlq"} 0.0' in text


@pytest.mark.django_db
def test_outbox_lag_drops_to_zero_once_relayed(broker):
    make_job()
    EventOutbox.objects.update(created_at=timezone.now() - timedelta(seconds=30))
    assert metrics_refresh_gauges()["outbox_lag"] >= 29
    before = metrics.OUTBOX_RELAYED._value.get()
    outbox_relay_once()
    assert metrics.OUTBOX_RELAYED._value.get() == before + 1
    values = metrics_refresh_gauges()
    assert values["outbox_lag"] == 0 and values["outbox_unpublished"] == 0


# --- logs -------------------------------------------------------------------------------
@pytest.fixture
def json_log():
    """A logger rendering through the production JSON chain into a buffer."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter(json=True))
    logger = logging.getLogger("tests.observability")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    clear_request_context()

    def lines() -> list[dict]:
        return [json.loads(line) for line in stream.getvalue().splitlines()]

    yield lines
    logger.removeHandler(handler)
    logger.propagate = True
    clear_request_context()


@pytest.fixture
def django_request_log():
    """What the django.request logger writes (it does not propagate to the root), through
    the production JSON chain."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter(json=True))
    logger = logging.getLogger("django.request")
    logger.addHandler(handler)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    logger.removeHandler(handler)


@pytest.mark.django_db
def test_a_refused_portal_request_is_logged_as_one_line_without_a_traceback(
    client, django_request_log
):
    viewer = otp_login(client, role_user("viewer"))
    job = make_job()
    assert viewer.post(f"/admin/jobs/job/{job.id}/cancel/").status_code == 403
    [line] = [e for e in django_request_log() if e.get("status_code") == 403]
    assert line["level"] == "warning"
    assert line["path"] == f"/admin/jobs/job/{job.id}/cancel/"
    assert line["error"] == "PermissionDenied"
    assert "exception" not in line and "Traceback" not in json.dumps(line)


@pytest.mark.django_db
@pytest.mark.parametrize("rendering", ["json", "console"])
def test_control_characters_of_a_path_are_escaped_in_the_log_line(client, rendering):
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter(json=rendering == "json"))
    logger = logging.getLogger("django.request")
    logger.addHandler(handler)
    try:
        response = client.get("/nowhere/a%00b%0Dforged%0A%1B[31mred%5Cx00")
    finally:
        logger.removeHandler(handler)
    assert response.status_code == 404
    written = stream.getvalue()
    shown = "/nowhere/a\\x00b\\rforged\\n\\x1b[31mred\\\\x00"
    assert written.count("\n") == 1, written  # one line, whatever the URL held
    assert not any(c in written[:-1] for c in "\x00\r\n\x1b")
    if rendering == "json":
        line = json.loads(written)
        assert line["path"] == shown and line["event"] == f"Not Found: {shown}"
    else:
        assert f"path={shown}" in written and f"Not Found: {shown}" in written


def test_a_server_error_keeps_its_traceback(django_request_log):
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("django.request").error(
            "Internal Server Error: %s", "/x", exc_info=True, extra={"status_code": 500}
        )
    [line] = django_request_log()
    assert line["level"] == "error" and "Traceback" in line["exception"]
    assert "RuntimeError: boom" in line["exception"]


def test_secrets_and_personal_data_are_masked_in_json_logs(json_log):
    log = structlog.get_logger("tests.observability")
    log.info(
        "login_attempt",
        password="hunter2",
        Authorization="Bearer abc.def.ghi",
        user_email="ann@example.com",
        api_token="tok-123456",
        cookie="sessionid=xyz",
        headers={"X-Api-Key": "k-1", "Cookie": "c", "Accept": "application/json"},
        note="mail bob@example.org with Bearer abcdef123456 at amqp://guest:pw0rd@mq:5672//",
        idempotency_key="order-42",
        job_id="j-1",
    )
    (line,) = json_log()
    for key in ("password", "Authorization", "user_email", "api_token", "cookie"):
        assert line[key] == MASK, key
    assert line["headers"] == {"X-Api-Key": MASK, "Cookie": MASK, "Accept": "application/json"}
    assert line["note"] == f"mail {MASK} with Bearer {MASK} at amqp://guest:{MASK}@mq:5672//"
    # Not secrets: every line carries them (docs/operations/observability.md#logs).
    assert line["idempotency_key"] == "order-42" and line["job_id"] == "j-1"
    assert line["level"] == "info" and line["event"] == "login_attempt"
    assert line["timestamp"].endswith("Z")
    raw = json.dumps(line)
    for secret in ("hunter2", "abc.def.ghi", "ann@example.com", "tok-123456", "pw0rd", "xyz"):
        assert secret not in raw


def test_standard_library_records_and_tracebacks_are_masked_too(json_log):
    std = logging.getLogger("tests.observability")
    std.warning("connecting as %s", "carl@example.net", extra={"secret": "s3", "queue": "sim"})
    try:
        raise ValueError("bad token for dora@example.com")
    except ValueError:
        structlog.get_logger("tests.observability").exception("handler_failed")
    first, second = json_log()
    assert first["event"] == f"connecting as {MASK}"
    assert first["secret"] == MASK and first["queue"] == "sim"
    assert first["level"] == "warning" and first["logger"] == "tests.observability"
    assert "dora@example.com" not in second["exception"]
    assert "ValueError" in second["exception"]


def test_bound_context_appears_on_every_line_until_cleared(json_log):
    log = structlog.get_logger("tests.observability")
    bind_request_context(request_id="req-1", correlation_id=None)
    with log_context(job_id="job-9", attempt=2):
        log.info("inside")
    log.info("after")
    clear_request_context()
    log.info("cleared")
    inside, after, cleared = json_log()
    assert (inside["request_id"], inside["job_id"], inside["attempt"]) == ("req-1", "job-9", 2)
    assert "correlation_id" not in inside  # None values are not bound
    assert after["request_id"] == "req-1" and "job_id" not in after
    assert "request_id" not in cleared
