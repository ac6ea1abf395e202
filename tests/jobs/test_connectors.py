"""Connector breakers (docs/connectors.md), in process: a worker's delivery is
`job_execute` against an ERP stand-in on 127.0.0.1; the breaker, the jobs and the audit
chains are the real PostgreSQL rows. With a real worker and dispatcher:
tests/e2e/test_connector_outage.py."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.utils import timezone
from prometheus_client import REGISTRY
from rest_framework.test import APIClient

from audit.models import AuditLog
from audit.services import OPS_CHAIN, Actor
from audit.verification import audit_verify
from jobs.domain.errors import JobError, JobValidationError, RetryableError, TransientExternalError
from jobs.domain.exceptions import ConnectorControlInputError, ConnectorNotFoundError
from jobs.handlers.http import retry_after_seconds
from jobs.integrations.metrics import metrics_refresh_gauges
from jobs.models import ConnectorBreaker, DeadLetter, Job
from jobs.processes.runtime import job_execute
from jobs.services import retry_delay
from jobs.services.connectors import (
    BreakerEnd,
    blocked_types,
    breakers_count,
    breakers_forget,
    connector_close,
    connector_gate,
    connector_open,
    connector_probe_release,
)
from tenants.models import OperatorScope
from tests.erp_receiver import Receiver
from tests.factories import (
    OrganisationFactory,
    client_for,
    fence_of,
    job_in_state,
    otp_login,
    role_user,
)
from tests.processes import job_events

pytestmark = pytest.mark.django_db

OPERATOR = Actor.system("test-operator")
ERP = {"failures": 3, "cooldown_seconds": 60.0, "probe_wait_seconds": 5.0, "jitter_seconds": 2.0}


@pytest.fixture(autouse=True)
def _breakers(settings):
    settings.JOBOPS_CONNECTORS = {"erp": dict(ERP)}
    settings.JOBOPS_CONNECTOR_CACHE_SECONDS = 0  # every read sees the row as it is
    breakers_forget()
    yield
    breakers_forget()


@pytest.fixture
def erp(settings):
    with Receiver() as server:
        settings.JOBOPS_ERP_WEBHOOK_URL = server.url
        yield server


def erp_job(status: str = "queued") -> Job:
    return job_in_state(status, job_type="erp", params={"event": "invoice.paid"})


def deliver(job: Job) -> dict:
    """One delivery of the job's message to a worker, in this process."""
    return job_execute(payload={"job_id": str(job.id)}, hostname="test-host")


def breaker() -> ConnectorBreaker:
    return ConnectorBreaker.objects.get(name="erp")


def ops_events() -> list[str]:
    rows = AuditLog.objects.filter(chain=OPS_CHAIN).order_by("seq")
    return [r.event_type for r in rows if r.event_type.startswith("connector_")]


def ops_data(event_type: str) -> list[dict]:
    rows = AuditLog.objects.filter(chain=OPS_CHAIN, event_type=event_type).order_by("seq")
    return [json.loads(r.payload)["data"] for r in rows]


def gauge() -> float | None:
    metrics_refresh_gauges()
    return REGISTRY.get_sample_value("connector_state", {"connector": "erp"})


def probe_due_now() -> None:
    """As if the cool-down had passed (the database's clock decides)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE connector_breakers SET probe_at = now() - interval '1 second' "
            "WHERE name = 'erp'"
        )


def open_by_failures() -> None:
    for _ in range(ERP["failures"]):
        job = erp_job("running")
        breakers_count([BreakerEnd("erp", job.id, "ERP_503")])


def seconds_until(when) -> float:
    return (when - timezone.now()).total_seconds()


# --- the breaker's own transitions ---


def test_connector_failures_in_a_row_open_the_breaker_audited_and_the_gauge_says_so(erp):
    erp.status = 503
    assert gauge() == 0
    jobs = [erp_job() for _ in range(ERP["failures"])]
    outcomes = [deliver(job)["outcome"] for job in jobs]
    assert outcomes == ["retrying"] * 3
    row = breaker()
    assert (row.state, row.failures, row.last_error_code) == ("open", 3, "ERP_503")
    assert 55 < seconds_until(row.probe_at) <= 60
    assert ops_events() == ["connector_opened"]
    [opened] = ops_data("connector_opened")
    assert (opened["connector"], opened["failures"], opened["cause"]) == ("erp", 3, "failures")
    assert opened["job_id"] == str(jobs[-1].id)
    assert gauge() == 2
    # The job whose failure opened it waits for the probe, not for its short backoff.
    last = Job.objects.get(id=jobs[-1].id)
    assert seconds_until(last.next_run_at) > 55
    assert audit_verify().ok


def test_a_4xx_is_no_connector_failure_and_a_success_resets_the_count(erp):
    erp.status = 503
    for _ in range(2):
        deliver(erp_job())
    assert breaker().failures == 2
    erp.status = 422
    with pytest.raises(Exception, match="nonretryable"):
        deliver(erp_job())
    assert (breaker().state, breaker().failures) == ("closed", 2)
    erp.status = 200
    assert deliver(erp_job())["outcome"] == "succeeded"
    assert (breaker().state, breaker().failures) == ("closed", 0)
    assert ops_events() == []


def test_a_claimed_job_of_an_open_connector_is_deferred_without_spending_its_attempt(erp):
    connector_open(name="erp", reason="INC-1: ERP maintenance", actor=OPERATOR)
    job = erp_job()
    summary = deliver(job)
    assert summary["outcome"] == "deferred"
    stored = Job.objects.get(id=job.id)
    assert (stored.status, stored.attempts, stored.locked_by) == ("retrying", 0, None)
    assert stored.last_error_code == "CONNECTOR_OPEN"
    # Due at the probe time plus at most the jitter: not all waiting jobs at once.
    probe_at = breaker().probe_at
    assert probe_at <= stored.next_run_at <= probe_at + timedelta(seconds=ERP["jitter_seconds"])
    assert erp.requests == []  # the handler never ran
    assert job_events(job.id) == ["created", "queued", "started", "deferred"]
    [deferred] = AuditLog.objects.filter(job_id=job.id, event_type="deferred")
    data = json.loads(deferred.payload)["data"]
    assert (data["reason"], data["connector"], data["breaker"]) == ("connector_open", "erp", "open")
    assert data["attempt_given_back"] is True
    assert audit_verify(job_ids=[job.id]).ok


def test_after_the_cool_down_exactly_one_job_probes_and_its_success_closes_the_breaker():
    open_by_failures()
    probe_due_now()
    first, second = erp_job("running"), erp_job("running")
    gate = connector_gate(job=first, fence=fence_of(first))
    assert (gate.probe, gate.deferred) == (True, None)
    assert (breaker().state, breaker().probe_job_id) == ("half_open", first.id)
    assert gauge() == 1
    other = connector_gate(job=second, fence=fence_of(second))
    assert other.deferred is not None and not other.probe
    # The others wait the short probe-wait (plus jitter), not a whole cool-down.
    assert (
        ERP["probe_wait_seconds"]
        <= other.delay
        <= ERP["probe_wait_seconds"] + ERP["jitter_seconds"]
    )
    assert blocked_types() == ["erp"]
    assert breakers_count([BreakerEnd("erp", first.id)]) == [None]
    assert (breaker().state, breaker().failures, breaker().probe_job_id) == ("closed", 0, None)
    assert ops_events() == ["connector_opened", "connector_half_open", "connector_closed"]
    assert ops_data("connector_closed")[0]["cause"] == "probe_succeeded"
    assert blocked_types() == []
    assert gauge() == 0


def test_a_failed_probe_opens_the_breaker_again_for_a_whole_cool_down():
    open_by_failures()
    probe_due_now()
    probe = erp_job("running")
    assert connector_gate(job=probe, fence=fence_of(probe)).probe
    (seen,) = breakers_count([BreakerEnd("erp", probe.id, "ERP_502")])
    assert seen is not None and seen.state == "open"
    assert (
        ERP["cooldown_seconds"] - 5 < seen.wait <= ERP["cooldown_seconds"] + ERP["jitter_seconds"]
    )
    assert breaker().state == "open" and seconds_until(breaker().probe_at) > 55
    assert ops_data("connector_opened")[-1]["cause"] == "probe_failed"


def test_a_probe_that_ends_without_a_verdict_lets_the_next_job_probe():
    open_by_failures()
    probe_due_now()
    first, second = erp_job("running"), erp_job("running")
    gate = connector_gate(job=first, fence=fence_of(first))
    connector_probe_release(gate=gate, job_id=first.id)  # e.g. it was cancelled
    assert (breaker().state, breaker().probe_job_id) == ("half_open", None)
    assert connector_gate(job=second, fence=fence_of(second)).probe


def test_blocked_types_names_the_types_whose_connector_must_not_start_a_job_now():
    assert blocked_types() == []
    open_by_failures()
    assert blocked_types() == ["erp"]
    probe_due_now()  # a job must be claimed to probe it
    assert blocked_types() == []


def test_the_last_attempt_failing_into_an_open_breaker_waits_instead_of_dead_lettering(
    erp, settings
):
    table = {name: dict(spec) for name, spec in settings.JOB_TYPES.items()}
    table["erp"]["max_retries"] = 0
    settings.JOB_TYPES = table
    settings.JOBOPS_CONNECTORS = {"erp": {**ERP, "failures": 1}}
    erp.status = 503
    job = erp_job()
    assert job.max_attempts == 1
    assert deliver(job)["outcome"] == "retrying"
    stored = Job.objects.get(id=job.id)
    assert (stored.status, stored.attempts, stored.max_attempts) == ("retrying", 1, 2)
    assert not DeadLetter.objects.filter(job_id=job.id).exists()
    assert audit_verify(job_ids=[job.id]).ok


# --- provider-aware backoff ---


def test_a_503_with_retry_after_sets_the_next_attempt_at_least_that_far_out(erp):
    erp.status, erp.extra_headers = 503, {"Retry-After": "120"}
    job = erp_job()
    assert deliver(job)["outcome"] == "retrying"
    assert 115 < seconds_until(Job.objects.get(id=job.id).next_run_at) <= 121


def test_a_429_retry_after_delays_the_job_but_counts_no_connector_failure(erp):
    erp.status, erp.extra_headers = 429, {"Retry-After": "90"}
    job = erp_job()
    assert deliver(job)["outcome"] == "retrying"
    assert 85 < seconds_until(Job.objects.get(id=job.id).next_run_at) <= 91
    assert not ConnectorBreaker.objects.filter(name="erp", failures__gt=0).exists()


def test_a_retry_after_is_capped_and_a_bad_one_ignored(erp, settings):
    settings.JOBOPS_RETRY_AFTER_MAX_SECONDS = 30
    erp.status, erp.extra_headers = 503, {"Retry-After": "86400"}
    capped = erp_job()
    deliver(capped)
    assert 25 < seconds_until(Job.objects.get(id=capped.id).next_run_at) <= 31
    erp.extra_headers = {"Retry-After": "soon"}
    ignored = erp_job()
    deliver(ignored)  # the usual backoff: at most 2 s x 1.5 on a first attempt
    assert seconds_until(Job.objects.get(id=ignored.id).next_run_at) <= 3.1


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("120", 120.0),
        (" 7 ", 7.0),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # a date in the past: now
        ("-5", None),
        ("1.5", None),
        ("soon", None),
        ("", None),
        (None, None),
        ("9" * 100, None),
    ],
)
def test_retry_after_header_values(header, seconds):
    assert retry_after_seconds(header) == seconds


def test_a_handler_raises_a_retryable_error_carrying_its_delay(settings):
    settings.JOBOPS_RETRY_AFTER_MAX_SECONDS = 600
    assert RetryableError("later", retry_after=300).retry_after == 300
    assert retry_delay(attempt=1, cap=45, retry_after=300) == 300
    assert retry_delay(attempt=1, cap=45, retry_after=10_000) == 600
    for bad in (-1, float("nan"), float("inf"), "60", True):
        assert JobError("x", retry_after=bad).retry_after is None  # type: ignore[arg-type]
    assert retry_delay(attempt=1, cap=45, retry_after=None) <= 3
    assert not JobValidationError("4xx").connector_failure
    assert TransientExternalError("5xx").connector_failure


# --- seeing and steering ---


def test_get_connectors_shows_each_breaker_without_secrets(settings):
    settings.JOBOPS_ERP_WEBHOOK_URL = "https://user:s3cret@erp.example.com/hook"
    api = client_for(role_user("viewer"))
    [closed] = api.get("/api/v1/connectors").json()
    assert (closed["name"], closed["state"], closed["failures"]) == ("erp", "closed", 0)
    assert (closed["failure_threshold"], closed["job_types"]) == (3, ["erp"])
    open_by_failures()
    [body] = api.get("/api/v1/connectors").json()
    assert (body["state"], body["failures"], body["last_error_code"]) == ("open", 3, "ERP_503")
    assert body["opened_at"] and body["next_probe_at"]
    text = json.dumps(body)
    assert "s3cret" not in text and "example.com" not in text and "reason" not in body
    assert APIClient().get("/api/v1/connectors").status_code == 401


def test_a_type_that_opted_in_answers_409_with_retry_after_while_its_connector_is_open(settings):
    table = {name: dict(spec) for name, spec in settings.JOB_TYPES.items()}
    table["erp"]["connector_open"] = "refuse"
    settings.JOB_TYPES = table
    api = client_for(role_user("viewer"))
    body = {"type": "erp", "params": {"event": "e"}, "idempotency_key": "k1"}
    assert api.post("/api/v1/jobs", body, format="json").status_code == 201
    connector_open(name="erp", reason="INC-2", actor=OPERATOR)
    refused = api.post("/api/v1/jobs", {**body, "idempotency_key": "k2"}, format="json")
    assert refused.status_code == 409, refused.content
    assert refused.json()["error"]["code"] == "ERR-CONNECTOR-OPEN"
    assert 55 <= int(refused["Retry-After"]) <= 60
    # A repeat of a key that made its job is still answered with that job.
    assert api.post("/api/v1/jobs", body, format="json").status_code == 200
    assert not Job.objects.filter(idempotency_key="k2").exists()


def test_a_type_that_did_not_opt_in_is_accepted_and_waits_while_its_connector_is_open():
    connector_open(name="erp", reason="INC-3", actor=OPERATOR)
    api = client_for(role_user("viewer"))
    created = api.post("/api/v1/jobs", {"type": "erp", "params": {"event": "e"}}, format="json")
    assert created.status_code == 201 and created.json()["status"] == "pending"


def test_operators_open_and_close_by_hand_audited_with_their_justification(erp):
    assert connector_open(name="erp", reason="INC-4: ERP upgrade", actor=OPERATOR)
    assert not connector_open(name="erp", reason="again", actor=OPERATOR)  # first stands
    assert (breaker().state, breaker().reason) == ("open", "INC-4: ERP upgrade")
    waiting = erp_job()
    deliver(waiting)
    assert seconds_until(Job.objects.get(id=waiting.id).next_run_at) > 55
    assert connector_close(name="erp", reason="ERP is back", actor=OPERATOR)
    assert not connector_close(name="erp", reason="again", actor=OPERATOR)
    # Closing brings the jobs it held forward, spread over the jitter.
    assert seconds_until(Job.objects.get(id=waiting.id).next_run_at) <= ERP["jitter_seconds"]
    opened, closed = ops_data("connector_opened"), ops_data("connector_closed")
    assert (opened[0]["manual"], opened[0]["reason"]) == (True, "INC-4: ERP upgrade")
    assert (closed[0]["reason"], closed[0]["released"]) == ("ERP is back", 1)
    assert audit_verify().ok


@pytest.mark.parametrize(
    ("name", "reason", "error"),
    [
        ("erp", "", ConnectorControlInputError),
        ("erp", "x" * 501, ConnectorControlInputError),
        ("nope", "why", ConnectorNotFoundError),
    ],
)
def test_a_control_without_justification_or_of_no_connector_is_refused(name, reason, error):
    with pytest.raises(error):
        connector_open(name=name, reason=reason, actor=OPERATOR)
    assert not ConnectorBreaker.objects.exists()


OPEN, CLOSE = "/api/v1/admin/connectors/erp/open", "/api/v1/admin/connectors/erp/close"


def session_api(user) -> APIClient:
    return otp_login(APIClient(enforce_csrf_checks=False), user)


def test_the_admin_api_opens_and_closes_for_an_unrestricted_operator_only():
    api = session_api(role_user("operator"))
    body = api.post(OPEN, {"reason": "INC-5"}, format="json").json()
    assert (body["state"], body["changed"], body["reason"]) == ("open", True, "INC-5")
    assert api.post(OPEN, {"reason": "x"}, format="json").json()["changed"] is False
    viewer = session_api(role_user("viewer"))
    limited_user = role_user("operator", username="bea")
    OperatorScope.objects.create(user=limited_user).organisations.add(OrganisationFactory())
    for refused in (viewer, session_api(limited_user)):
        response = refused.post(CLOSE, {"reason": "x"}, format="json")
        assert response.status_code == 403 and response.json()["error"]["code"] == "ERR-DLQ-403"
    assert client_for(role_user("operator")).post(CLOSE, {"reason": "x"}).status_code == 401
    body = api.post(CLOSE, {"reason": "back"}, format="json").json()
    assert (body["state"], body["changed"]) == ("closed", True)
    [opened] = AuditLog.objects.filter(chain=OPS_CHAIN, event_type="connector_opened")
    assert (opened.actor_type, opened.actor_id) == ("operator", str(api.user.pk))


@pytest.mark.parametrize(
    ("url", "body", "status"),
    [
        (OPEN, {}, 400),
        (OPEN, {"reason": "x" * 501}, 400),
        ("/api/v1/admin/connectors/nope/open", {"reason": "x"}, 404),
    ],
)
def test_the_admin_api_refuses_bad_input(url, body, status):
    response = session_api(role_user("operator")).post(url, body, format="json")
    assert response.status_code == status, response.content
    assert response.json()["error"]["code"] == f"ERR-DLQ-{status}"
    assert not ConnectorBreaker.objects.filter(state="open").exists()


def test_the_dashboard_shows_breakers_and_offers_open_and_close_to_operators_only():
    connector_open(name="erp", reason="INC-6", actor=OPERATOR)
    operator = otp_login(Client(), role_user("operator"))
    page = operator.get("/admin/dashboard/panel/").content.decode()
    assert 'data-connector="erp"' in page and "connector-close" in page
    assert ">Close breaker (resume calls)</a>" in page
    assert "Connector erp is open" in page
    viewer = otp_login(Client(), role_user("viewer"))
    page = viewer.get("/admin/dashboard/panel/").content.decode()
    assert 'data-connector="erp"' in page and "connector-close" not in page
    assert viewer.post("/admin/connectors/erp/close/", {"reason": "x"}).status_code == 403
    form = operator.get("/admin/connectors/erp/close/")
    assert form.status_code == 200 and "id_reason" in form.content.decode()
    # Issue 37, L15: "Close" read like closing a dialog; the buttons say what they do.
    assert "Close erp's breaker (resume its calls)" in form.content.decode()
    refused = operator.post("/admin/connectors/erp/close/", {"reason": " "})
    assert "control-error" in refused.content.decode() and breaker().state == "open"
    assert operator.post("/admin/connectors/erp/close/", {"reason": "ok"}).status_code == 302
    assert (breaker().state, breaker().changed_by) == ("closed", operator.user)
    assert operator.get("/admin/connectors/nope/open/").status_code == 404


def test_the_command_shows_opens_and_closes():
    call_command("connector", "open", "erp", "--reason", "INC-7", stdout=StringIO())
    out = StringIO()
    call_command("connector", "status", "--json", stdout=out)
    [row] = json.loads(out.getvalue())
    assert (row["name"], row["state"], row["reason"]) == ("erp", "open", "INC-7")
    out = StringIO()
    call_command("connector", "close", "erp", "--reason", "fixed", stdout=out)
    assert "erp closed" in out.getvalue() and breaker().state == "closed"
    for args in (["open", "erp"], ["open"], ["close", "nope", "--reason", "x"], ["status", "no"]):
        with pytest.raises(CommandError):
            call_command("connector", *args, stdout=StringIO())
    # One line for the terminal: the service's message, not its details repeated.
    with pytest.raises(CommandError, match=r"^no connector 'nope'$"):
        call_command("connector", "close", "nope", "--reason", "x", stdout=StringIO())
