"""Operator controls on queues (docs/operator-controls.md): pause and resume (services,
command, admin API, dashboard), the dispatcher and the worker honouring a pause, the
broker window taken highest priority first, and the queue state for consumers."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.cache import cache
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AuditLog
from audit.services import OPS_CHAIN, Actor
from jobs.domain.exceptions import QueueControlInputError, QueueNotFoundError
from jobs.integrations import metrics
from jobs.integrations.metrics import metrics_refresh_gauges
from jobs.integrations.publisher import wire_payload
from jobs.models import Job, QueuePause
from jobs.processes.runtime import job_execute
from jobs.queries import QUERIES
from jobs.selectors import queues_for_consumers_forget
from jobs.services import job_create, publish_due_once
from jobs.services.queues import queue_pause, queue_resume
from tenants.models import OperatorScope
from tests.factories import (
    OrganisationFactory,
    StaffFactory,
    UserFactory,
    client_for,
    job_in_state,
    make_job,
    otp_login,
    role_user,
)
from tests.processes import job_events

pytestmark = pytest.mark.django_db

OPERATOR = Actor.system("test-operator")


@pytest.fixture(autouse=True)
def _fresh():
    cache.clear()
    queues_for_consumers_forget()
    yield
    queues_for_consumers_forget()


def ops_entries(event_type: str) -> list[dict]:
    rows = AuditLog.objects.filter(chain=OPS_CHAIN, event_type=event_type).order_by("seq")
    return [json.loads(r.payload)["data"] for r in rows]


def statuses(*jobs: Job) -> list[str]:
    return [Job.objects.get(id=j.id).status for j in jobs]


# --- services ---


def test_pause_and_resume_write_the_row_and_audit_each_once_with_the_reason():
    assert queue_pause(queue="sim", reason="ERP down, INC-1", actor=OPERATOR)
    assert not queue_pause(queue="sim", reason="again", actor=OPERATOR)  # already paused
    pause = QueuePause.objects.get(queue="sim")
    assert pause.reason == "ERP down, INC-1"
    assert queue_resume(queue="sim", reason="ERP back", actor=OPERATOR)
    assert not queue_resume(queue="sim", reason="again", actor=OPERATOR)
    assert not QueuePause.objects.exists()
    assert ops_entries("queue_paused") == [{"queue": "sim", "reason": "ERP down, INC-1"}]
    assert ops_entries("queue_resumed") == [{"queue": "sim", "reason": "ERP back"}]


@pytest.mark.parametrize("reason", ["", "   ", "x" * 501])
def test_a_pause_needs_a_bounded_justification(reason):
    with pytest.raises(QueueControlInputError):
        queue_pause(queue="sim", reason=reason, actor=OPERATOR)
    assert not QueuePause.objects.exists()
    assert not ops_entries("queue_paused")


def test_an_unknown_queue_cannot_be_paused():
    with pytest.raises(QueueNotFoundError):
        queue_pause(queue="nope", reason="why", actor=OPERATOR)


# --- the dispatcher ---


def test_a_paused_queues_pending_and_due_retrying_jobs_are_not_published_until_resume(broker):
    waiting = make_job()
    retry = job_in_state("retrying", retry_in=0)
    other = make_job(job_type="report", params={})
    queue_pause(queue="sim", reason="incident", actor=OPERATOR)
    assert publish_due_once() == 1
    assert statuses(waiting, retry, other) == ["pending", "retrying", "queued"]
    queue_resume(queue="sim", reason="over", actor=OPERATOR)
    assert publish_due_once() == 2
    assert statuses(waiting, retry) == ["queued", "queued"]


def test_creation_still_answers_201_while_paused(broker):
    queue_pause(queue="sim", reason="incident", actor=OPERATOR)
    response = client_for(UserFactory()).post(
        "/api/v1/jobs", {"type": "sim", "params": {"steps": 1}}, format="json"
    )
    assert response.status_code == 201, response.content
    assert response.json()["status"] == "pending"


def explain(statement: str, params: dict) -> str:
    sql = QUERIES[statement]
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # as on a large table
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def test_the_publish_statements_keep_their_index_order_with_a_queue_paused():
    queue_pause(queue="sim", reason="incident", actor=OPERATOR)
    now = timezone.now()
    plan = explain(
        "due_pending_jobs",
        {"before": now, "skip": [], "limit": 500, "window": 50, "skip_queues": []},
    )
    assert "jobs_pending_priority_idx" in plan, plan
    assert "Sort" not in plan, plan  # the index gives the order: each LIMIT stops its scan
    assert "queue_pauses" in plan, plan
    plan = explain(
        "due_retrying_jobs", {"before": now, "skip": [], "limit": 500, "skip_queues": []}
    )
    assert "jobs_retry_due_idx" in plan and "Sort" not in plan, plan


# --- priority and the broker window ---


def test_priority_defaults_to_5_and_is_in_the_body(broker):
    client = client_for(UserFactory())
    body = client.post("/api/v1/jobs", {"type": "sim", "params": {}}, format="json").json()
    assert body["priority"] == 5
    body = client.post(
        "/api/v1/jobs", {"type": "sim", "params": {}, "priority": 7}, format="json"
    ).json()
    assert body["priority"] == 7 and Job.objects.get(id=body["id"]).priority == 7


def test_a_priority_above_7_needs_staff_powers_else_422_per_field(broker):
    response = client_for(UserFactory()).post(
        "/api/v1/jobs", {"type": "sim", "params": {}, "priority": 9}, format="json"
    )
    assert response.status_code == 422, response.content
    error = response.json()["error"]
    assert error["code"] == "ERR-JOB-422" and "priority" in error["details"]
    assert not Job.objects.exists()
    job, _ = job_create(owner=StaffFactory(), job_type="sim", params={}, priority=9, staff=True)
    assert job.priority == 9


@pytest.mark.parametrize("priority", [-1, 10, "high", 2.5, True, None])
def test_a_priority_out_of_range_or_not_an_integer_is_refused(broker, priority):
    response = client_for(UserFactory()).post(
        "/api/v1/jobs", {"type": "sim", "params": {}, "priority": priority}, format="json"
    )
    assert response.status_code in (400, 422), response.content
    assert not Job.objects.exists()


@pytest.mark.parametrize("priority", [-1, 10, "9", True, 5.0])
def test_the_service_refuses_a_priority_that_is_no_integer_0_to_9(priority):
    from jobs.domain.exceptions import JobPriorityInvalidError

    with pytest.raises(JobPriorityInvalidError) as refused:
        job_create(owner=StaffFactory(), job_type="sim", params={}, priority=priority, staff=True)
    assert "priority" in refused.value.details
    assert not Job.objects.exists()


def test_the_window_takes_the_highest_priority_first_then_the_oldest(broker, settings):
    settings.JOBOPS_BROKER_WINDOW = 3
    owner = UserFactory()

    def make(priority: int) -> Job:
        return job_create(owner=owner, job_type="sim", params={}, priority=priority, staff=True)[0]

    low_old, low_new = make(3), make(3)
    high, mid_old, mid_new = make(9), make(5), make(5)
    assert publish_due_once() == 3
    assert statuses(high, mid_old, mid_new, low_old, low_new) == [
        "queued", "queued", "queued", "pending", "pending"
    ]  # fmt: skip
    # The window is full (three queued): nothing more until a claim frees a place.
    assert publish_due_once() == 0
    Job.objects.filter(id=high.id).update(status="running", locked_by="w")
    assert publish_due_once() == 1
    assert statuses(low_old, low_new) == ["queued", "pending"]


def test_the_window_is_per_queue(broker, settings):
    settings.JOBOPS_BROKER_WINDOW = 1
    sims = [make_job() for _ in range(2)]
    report = make_job(job_type="report", params={})
    assert publish_due_once() == 2
    assert statuses(*sims, report) == ["queued", "pending", "queued"]


# --- the worker ---


def test_a_worker_holds_a_paused_queues_message_without_spending_an_attempt():
    job = job_in_state("queued")
    queue_pause(queue="sim", reason="incident", actor=OPERATOR)
    outcome = job_execute(payload=wire_payload(job))
    assert outcome == {"job_id": str(job.id), "outcome": "held"}
    held = Job.objects.get(id=job.id)
    assert (held.status, held.attempts) == ("pending", 0)
    assert job_events(job.id)[-1] == "held"
    entry = AuditLog.objects.filter(chain=f"job:{job.id}", event_type="held").get()
    assert json.loads(entry.payload)["data"]["reason"] == "queue_paused"


def test_a_worker_runs_the_message_once_the_queue_is_resumed():
    job = job_in_state("queued")
    queue_pause(queue="sim", reason="incident", actor=OPERATOR)
    queue_resume(queue="sim", reason="over", actor=OPERATOR)
    assert job_execute(payload=wire_payload(job))["outcome"] == "succeeded"


# --- the command ---


def test_the_command_pauses_shows_and_resumes_a_queue():
    alice = StaffFactory(username="alice")
    out = StringIO()
    call_command("queue", "pause", "sim", "--reason", "INC-7", "--as", "alice", stdout=out)
    assert "sim paused" in out.getvalue()
    assert QueuePause.objects.get(queue="sim").paused_by == alice
    out = StringIO()
    call_command("queue", "status", "sim", "--json", stdout=out)
    [row] = json.loads(out.getvalue())
    assert (row["name"], row["paused"], row["paused_by"], row["reason"]) == (
        "sim", True, "alice", "INC-7"
    )  # fmt: skip
    out = StringIO()
    call_command("queue", "status", stdout=out)
    assert "paused" in out.getvalue() and "report" in out.getvalue()
    call_command("queue", "resume", "sim", "--reason", "fixed", stdout=StringIO())
    assert not QueuePause.objects.exists()
    [resumed] = AuditLog.objects.filter(chain=OPS_CHAIN, event_type="queue_resumed")
    assert resumed.actor_type == "system"


@pytest.mark.parametrize(
    "args",
    [
        ["pause", "sim"],  # no reason
        ["pause"],  # no queue
        ["pause", "nope", "--reason", "x"],
        ["pause", "sim", "--reason", "x", "--as", "nobody"],
        ["status", "nope"],
    ],
)
def test_the_command_refuses_bad_input(args):
    with pytest.raises(CommandError):
        call_command("queue", *args, stdout=StringIO())
    assert not QueuePause.objects.exists()


# --- the admin API ---

PAUSE = "/api/v1/admin/queues/sim/pause"
RESUME = "/api/v1/admin/queues/sim/resume"


def session_api(user) -> APIClient:
    return otp_login(APIClient(enforce_csrf_checks=False), user)


def test_an_operator_pauses_and_resumes_through_the_admin_api():
    api = session_api(role_user("operator"))
    response = api.post(PAUSE, {"reason": "ERP down"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["paused"], body["changed"], body["reason"]) == (True, True, "ERP down")
    again = api.post(PAUSE, {"reason": "still"}, format="json").json()
    assert (again["paused"], again["changed"], again["reason"]) == (True, False, "ERP down")
    body = api.post(RESUME, {"reason": "ERP back"}, format="json").json()
    assert (body["paused"], body["changed"]) == (False, True)
    [paused] = AuditLog.objects.filter(chain=OPS_CHAIN, event_type="queue_paused")
    assert (paused.actor_type, paused.actor_id) == ("operator", str(api.user.pk))


def test_a_viewer_and_a_limited_operator_are_err_dlq_403():
    viewer = session_api(role_user("viewer"))
    limited_user = role_user("operator", username="bea")
    OperatorScope.objects.create(user=limited_user).organisations.add(OrganisationFactory())
    limited = session_api(limited_user)
    for api in (viewer, limited):
        response = api.post(PAUSE, {"reason": "x"}, format="json")
        assert response.status_code == 403, response.content
        assert response.json()["error"]["code"] == "ERR-DLQ-403"
    assert not QueuePause.objects.exists()


def test_the_admin_api_needs_a_verified_otp():
    response = client_for(role_user("operator")).post(PAUSE, {"reason": "x"}, format="json")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "ERR-DLQ-401"


@pytest.mark.parametrize(
    ("url", "body", "status", "code"),
    [
        (PAUSE, {}, 400, "ERR-DLQ-400"),
        (PAUSE, {"reason": ""}, 400, "ERR-DLQ-400"),
        (PAUSE, {"reason": "x" * 501}, 400, "ERR-DLQ-400"),
        (PAUSE, {"reason": "x", "extra": 1}, 200, None),
        ("/api/v1/admin/queues/nope/pause", {"reason": "x"}, 404, "ERR-DLQ-404"),
    ],
)
def test_the_admin_api_refuses_bad_input(url, body, status, code):
    response = session_api(role_user("operator")).post(url, body, format="json")
    assert response.status_code == status, response.content
    if code:
        assert response.json()["error"]["code"] == code
        assert not QueuePause.objects.exists()


# --- queue state: GET /api/v1/queues, the gauge, /readyz ---


def test_consumers_see_each_queues_depth_pause_and_oldest_pending_age(broker):
    first = make_job()
    make_job()
    Job.objects.filter(id=first.id).update(
        created_at=timezone.now() - timezone.timedelta(minutes=2)
    )
    queue_pause(queue="sim", reason="incident", actor=OPERATOR)
    response = client_for(UserFactory()).get("/api/v1/queues")
    assert response.status_code == 200, response.content
    rows = {row["name"]: row for row in response.json()}
    assert set(rows["sim"]) == {
        "name", "depth", "paused", "oldest_pending_age_seconds", "retry_after_seconds"
    }  # fmt: skip
    assert rows["sim"]["depth"] == 2 and rows["sim"]["paused"] is True
    assert 119 <= rows["sim"]["oldest_pending_age_seconds"] < 180
    assert rows["sim"]["retry_after_seconds"] == 60
    assert rows["report"] == {
        "name": "report", "depth": 0, "paused": False, "oldest_pending_age_seconds": None,
        "retry_after_seconds": 0,
    }  # fmt: skip
    # The async spec's name answers the same.
    alias = client_for(UserFactory()).get("/api/v1/jobs/queues/depth")
    assert alias.status_code == 200 and alias.json() == response.json()


def test_the_queue_state_is_memoised_for_a_few_seconds(broker):
    client = client_for(UserFactory())
    before = {r["name"]: r["depth"] for r in client.get("/api/v1/queues").json()}
    make_job()
    after = {r["name"]: r["depth"] for r in client.get("/api/v1/queues").json()}
    assert after["sim"] == before["sim"]  # the memo answered
    queues_for_consumers_forget()
    fresh = {r["name"]: r["depth"] for r in client.get("/api/v1/queues").json()}
    assert fresh["sim"] == before["sim"] + 1


def test_the_queue_state_needs_authentication_and_the_jobs_read_scope():
    assert APIClient().get("/api/v1/queues").status_code == 401


def test_the_queue_paused_gauge_moves_with_pause_and_resume():
    metrics_refresh_gauges()
    assert metrics.QUEUE_PAUSED.labels(queue="sim")._value.get() == 0
    queue_pause(queue="sim", reason="incident", actor=OPERATOR)
    assert metrics_refresh_gauges()["queues_paused"] == 1
    assert metrics.QUEUE_PAUSED.labels(queue="sim")._value.get() == 1
    assert metrics.QUEUE_PAUSED.labels(queue="report")._value.get() == 0
    queue_resume(queue="sim", reason="over", actor=OPERATOR)
    metrics_refresh_gauges()
    assert metrics.QUEUE_PAUSED.labels(queue="sim")._value.get() == 0


def test_readyz_names_the_paused_queues_without_their_reasons(client, settings):
    from core import health

    settings.JOBOPS_READY_CACHE_SECONDS = 0
    health._cache = None
    queue_pause(queue="sim", reason="secret customer incident", actor=OPERATOR)
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    [paused] = response.json()["paused_queues"]
    assert paused["queue"] == "sim" and "secret" not in response.content.decode()


# --- the dashboard ---


def test_the_dashboard_offers_pause_only_to_unrestricted_operators_and_shows_the_state_to_all():
    queue_pause(queue="report", reason="incident", actor=OPERATOR)
    operator = otp_login(Client(), role_user("operator"))
    page = operator.get("/admin/dashboard/panel/").content.decode()
    assert "queue-pause" in page and "queue-resume" in page and "queue-paused" in page
    viewer = otp_login(Client(), role_user("viewer"))
    page = viewer.get("/admin/dashboard/panel/").content.decode()
    assert "queue-paused" in page
    # At the top too, where a phone shows it without scrolling to the queue table.
    status = page[page.index('id="portal-status"') : page.index("</div>")]
    assert "Queue report is paused since" in status and "Needs attention" in status
    assert 'queue-pause"' not in page and "queue-resume" not in page
    limited_user = role_user("operator", username="bea")
    OperatorScope.objects.create(user=limited_user).organisations.add(OrganisationFactory())
    page = otp_login(Client(), limited_user).get("/admin/dashboard/panel/").content.decode()
    assert "queue-resume" not in page
    assert viewer.post("/admin/queues/sim/pause/", {"reason": "x"}).status_code == 403
    assert not QueuePause.objects.filter(queue="sim").exists()


def test_an_operator_pauses_from_the_dashboard_with_a_justification():
    operator = otp_login(Client(), role_user("operator"))
    form = operator.get("/admin/queues/sim/pause/")
    assert form.status_code == 200 and "id_reason" in form.content.decode()
    refused = operator.post("/admin/queues/sim/pause/", {"reason": "  "})
    assert refused.status_code == 200 and "control-error" in refused.content.decode()
    assert not QueuePause.objects.exists()
    done = operator.post("/admin/queues/sim/pause/", {"reason": "ERP down"})
    assert done.status_code == 302
    assert QueuePause.objects.get(queue="sim").paused_by == operator.user
    operator.post("/admin/queues/sim/resume/", {"reason": "ERP back"})
    assert not QueuePause.objects.exists()
    assert operator.get("/admin/queues/nope/pause/").status_code == 404
