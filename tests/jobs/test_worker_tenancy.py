"""Tenancy on the worker's and the dispatcher's side (docs/tenancy.md#execution,
#suspension, #limits): the message's org_id checked before a run, a suspended
organisation's work held and released, the report within its tenant, the
organisation's rate limit, and the tenant on log lines and (when asked) metrics."""

from __future__ import annotations

import json
import uuid

import pytest
from celery.exceptions import Reject
from django.db import connection
from django.utils import timezone

from audit.models import AuditLog
from audit.verification import audit_verify
from jobs.integrations.publisher import message_headers, wire_payload
from jobs.models import DeadLetter, Job
from jobs.processes.runtime import JobContext, job_execute
from jobs.services import Fence, HoldReason, job_hold, publish_due_once
from tenants.models import Organisation
from tests.factories import (
    OrganisationFactory,
    ProjectFactory,
    UserFactory,
    client_for,
    job_in_state,
    make_job,
)
from tests.metric_samples import Moved
from tests.processes import (
    assert_chain_valid,
    job_events,
    run_python,
    scripted_table,
    subprocess_env,
)

pytestmark = pytest.mark.django_db

RAN: list[uuid.UUID] = []


# Handlers of a `cam` job run in this process by job_execute, as a worker runs them.
def records_its_run(ctx, params):
    RAN.append(ctx.job_id)
    return {"org_id": ctx.org_id, "project_id": ctx.project_id}


def suspends_its_own_organisation(ctx, params):
    Organisation.objects.filter(id=ctx.org_id).update(suspended_at=timezone.now())
    return {"finished": True}


def member_of(slug: str):
    return UserFactory(org=OrganisationFactory(slug=slug))


def suspend(org_id: int) -> None:
    Organisation.objects.filter(id=org_id).update(suspended_at=timezone.now())


def resume(org_id: int) -> None:
    Organisation.objects.filter(id=org_id).update(suspended_at=None)


def queued_cam(settings, handler, owner):
    scripted_table(settings, cam={"handler": f"{__name__}.{handler.__name__}"})
    return job_in_state("queued", owner=owner, job_type="cam", params={"do": handler.__name__})


def held_entries(job_id):
    rows = AuditLog.objects.filter(job_id=job_id, event_type="held").order_by("seq")
    return [json.loads(row.payload)["data"] for row in rows]


# --- the message names its tenant ---------------------------------------------------------------


def test_the_message_and_its_headers_carry_the_jobs_org_id():
    job = make_job(owner=member_of("acme"))
    assert wire_payload(job)["org_id"] == job.org_id
    assert message_headers(job)["org_id"] == job.org_id


def test_a_message_naming_another_organisation_fails_the_job_without_running_it(settings):
    RAN.clear()
    job = queued_cam(settings, records_its_run, member_of("acme"))
    other = OrganisationFactory(slug="globex")
    with pytest.raises(Reject) as rejected:
        job_execute(payload={"job_id": str(job.id), "org_id": other.id}, hostname="t")
    assert rejected.value.requeue is False  # the broker's copy goes to the DLQ
    assert RAN == []
    stored = Job.objects.get(id=job.id)
    assert (stored.status, stored.last_error_code, stored.attempts) == (
        "failed",
        "TENANT_MISMATCH",
        0,  # never claimed: no attempt counted
    )
    letter = DeadLetter.objects.get(job_id=job.id)
    assert (letter.reason, letter.error_code, letter.state) == (
        "nonretryable",
        "TENANT_MISMATCH",
        "open",
    )
    assert job_events(job.id)[-1] == "failed"
    assert_chain_valid(job.id)


@pytest.mark.parametrize("forged", ["1", 1.0, None, True, 2**64, -1, [1]])
def test_an_org_id_that_is_no_organisations_id_is_a_mismatch(settings, forged):
    RAN.clear()
    job = queued_cam(settings, records_its_run, member_of("acme"))
    if forged == "1":  # the right id, as a string: still not what a publisher sends
        forged = str(job.org_id)
    with pytest.raises(Reject):
        job_execute(payload={"job_id": str(job.id), "org_id": forged}, hostname="t")
    assert RAN == []
    assert Job.objects.get(id=job.id).last_error_code == "TENANT_MISMATCH"


def test_a_message_without_org_id_is_run_in_the_rows_organisation(settings):
    RAN.clear()
    owner = member_of("acme")
    job = queued_cam(settings, records_its_run, owner)
    summary = job_execute(payload={"job_id": str(job.id)}, hostname="t")  # published before
    assert summary["outcome"] == "succeeded" and RAN == [job.id]
    assert Job.objects.get(id=job.id).result == {"org_id": job.org_id, "project_id": None}


def test_a_message_with_the_rows_org_id_runs_and_the_handler_sees_the_tenant(settings):
    owner = member_of("acme")
    project = ProjectFactory(organisation=Organisation.objects.get(slug="acme"))
    scripted_table(settings, cam={"handler": f"{__name__}.records_its_run"})
    from jobs.services import job_create
    from tenants.selectors import Placement

    job, _ = job_create(
        owner=owner,
        job_type="cam",
        params={"do": "x"},
        placement=Placement(org_id=project.organisation_id, project_id=project.id),
    )
    payload = wire_payload(job)
    summary = job_execute(payload=payload, hostname="t")
    assert summary["outcome"] == "succeeded"
    assert Job.objects.get(id=job.id).result == {"org_id": job.org_id, "project_id": project.id}


def test_a_mismatched_message_for_a_job_running_elsewhere_leaves_that_run_alone(settings):
    job = job_in_state("running", owner=member_of("acme"), worker="w1")
    other = OrganisationFactory(slug="globex")
    summary = job_execute(payload={"job_id": str(job.id), "org_id": other.id}, hostname="t")
    assert summary["outcome"] == "dropped"
    stored = Job.objects.get(id=job.id)
    assert (stored.status, stored.locked_by, stored.attempts) == ("running", "w1", 1)


def test_the_context_tenant_is_read_only():
    job = job_in_state("running", owner=member_of("acme"))
    ctx = JobContext(job=job, fence=Fence("w1", 1), log=None)
    assert ctx.org_id == job.org_id and ctx.project_id is None
    with pytest.raises(AttributeError):
        ctx.org_id = job.org_id + 1  # type: ignore[misc]


# --- suspension holds work ---------------------------------------------------------------------


def test_a_queued_job_of_a_suspended_organisation_is_held_without_spending_an_attempt(settings):
    RAN.clear()
    job = queued_cam(settings, records_its_run, member_of("acme"))
    suspend(job.org_id)
    summary = job_execute(payload=wire_payload(job), hostname="t")
    assert summary["outcome"] == "held" and RAN == []
    stored = Job.objects.get(id=job.id)
    assert (stored.status, stored.attempts, stored.locked_by) == ("pending", 0, None)
    assert stored.version > job.version  # a client sees the change
    (entry,) = held_entries(job.id)
    assert {k: entry[k] for k in ("from", "to", "attempt", "reason")} == {
        "from": "queued",
        "to": "pending",
        "attempt": 0,
        "reason": "org_suspended",
    }
    assert entry["context"]["org_id"] == job.org_id
    assert_chain_valid(job.id)
    # The verifier knows where `held` leaves a job: pending, as the row says.
    assert audit_verify(job_ids=[job.id]).ok
    # After resume the job is pending like any other: its next message runs it, attempt 1.
    resume(job.org_id)
    summary = job_execute(payload=wire_payload(stored), hostname="t")
    assert summary["outcome"] == "succeeded" and RAN == [job.id]
    assert Job.objects.get(id=job.id).attempts == 1
    assert job_events(job.id)[-4:] == ["queued", "held", "started", "succeeded"]


def test_a_retrying_job_of_a_suspended_organisation_stays_retrying(settings):
    job = job_in_state("retrying", owner=member_of("acme"), retry_in=0)
    suspend(job.org_id)
    summary = job_execute(payload=wire_payload(job), hostname="t")
    assert summary["outcome"] == "dropped"
    stored = Job.objects.get(id=job.id)
    assert (stored.status, stored.attempts) == ("retrying", 1)
    assert held_entries(job.id) == []


def test_a_running_job_of_an_organisation_suspended_meanwhile_finishes(settings):
    job = queued_cam(settings, suspends_its_own_organisation, member_of("acme"))
    summary = job_execute(payload=wire_payload(job), hostname="t")
    assert summary["outcome"] == "succeeded"
    assert Job.objects.get(id=job.id).result == {"finished": True}
    assert Organisation.objects.get(id=job.org_id).suspended


def test_a_hold_needs_a_known_reason_and_a_queued_job():
    job = job_in_state("pending", owner=member_of("acme"))
    with pytest.raises(ValueError):
        job_hold(job_id=job.id, reason="because", actor=None)  # type: ignore[arg-type]
    from jobs.services import WORKER

    assert job_hold(job_id=job.id, reason=HoldReason.ORG_SUSPENDED, actor=WORKER) is None
    assert Job.objects.get(id=job.id).status == "pending"


def test_the_dispatcher_publishes_no_work_of_a_suspended_organisation_until_resume(
    broker, settings
):
    settings.JOBOPS_DISPATCH_PENDING_AFTER_SECONDS = 0
    acme, globex = member_of("acme"), member_of("globex")
    held_pending = make_job(owner=acme)
    held_retry = job_in_state("retrying", owner=acme, retry_in=0)
    other = make_job(owner=globex)
    suspend(held_pending.org_id)
    assert publish_due_once() == 1
    status = dict(Job.objects.values_list("id", "status"))
    assert status[other.id] == "queued"
    assert (status[held_pending.id], status[held_retry.id]) == ("pending", "retrying")
    resume(held_pending.org_id)
    assert publish_due_once() == 2
    status = dict(Job.objects.values_list("id", "status"))
    assert status[held_pending.id] == status[held_retry.id] == "queued"


@pytest.mark.parametrize("statement", ["due_pending_jobs", "due_retrying_jobs"])
def test_the_dispatchers_statements_keep_their_index_with_the_suspension_filter(statement):
    from jobs.queries import QUERIES

    sql = QUERIES[statement].replace("FOR UPDATE SKIP LOCKED", "")
    params = {"before": timezone.now(), "skip": [], "limit": 500, "window": 50, "skip_queues": []}
    with connection.cursor() as cursor:
        # A table as the planner sees it in production: many rows, few pending. Without
        # a bitmap scan either: on the test database's statistics the planner may take
        # one and sort, which says nothing of whether the filter keeps the ordered path.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    # Pending jobs per queue in the broker window's order (docs/operator-controls.md).
    index = "jobs_pending_priority_idx" if statement == "due_pending_jobs" else "jobs_retry_due_idx"
    assert index in plan, plan
    assert "Sort" not in plan, plan  # the index gives the order: the LIMIT stops the scan


# --- the report stays in its tenant --------------------------------------------------------------


# --- the organisation's rate limit ----------------------------------------------------------


@pytest.mark.usefixtures("clean_redis")
def test_an_organisation_past_its_limit_gets_a_429_naming_the_org_limit(settings):
    settings.JOBOPS_RATE_LIMITS = {**settings.JOBOPS_RATE_LIMITS, "create_per_org": 2}
    acme = OrganisationFactory(slug="acme")
    first, second = client_in(acme), client_in(acme)
    body = {"type": "sim", "params": {"steps": 1, "step_seconds": 0}}
    assert first.post("/api/v1/jobs", body, format="json").status_code == 201
    assert second.post("/api/v1/jobs", body, format="json").status_code == 201
    moved = Moved()
    refused = first.post("/api/v1/jobs", body, format="json")  # the org's third create
    assert refused.status_code == 429
    assert moved("rate_limited_total", scope="organisation") == 1
    error = refused.json()["error"]
    assert error["code"] == "ERR-JOB-RATE-LIMIT"
    assert error["details"]["limit"] == "org"
    assert "organisation" in error["message"]
    assert int(refused["Retry-After"]) >= 1
    # Another organisation's members are not held back by it.
    outsider = client_in(OrganisationFactory(slug="globex"))
    assert outsider.post("/api/v1/jobs", body, format="json").status_code == 201


@pytest.mark.usefixtures("clean_redis")
def test_a_caller_in_several_organisations_counts_against_the_one_it_names(settings):
    settings.JOBOPS_RATE_LIMITS = {**settings.JOBOPS_RATE_LIMITS, "create_per_org": 1}
    acme, globex = OrganisationFactory(slug="acme"), OrganisationFactory(slug="globex")
    user = UserFactory(org=acme)
    UserFactory(username=user.username, org=globex)  # the same user, now in both
    client = client_for(user)
    body = {"type": "sim", "params": {"steps": 1, "step_seconds": 0}}
    assert client.post("/api/v1/jobs", {**body, "org": "acme"}, format="json").status_code == 201
    refused = client.post("/api/v1/jobs", {**body, "org": "acme"}, format="json")
    assert refused.status_code == 429 and refused.json()["error"]["details"]["limit"] == "org"
    assert client.post("/api/v1/jobs", {**body, "org": "globex"}, format="json").status_code == 201


@pytest.mark.usefixtures("clean_redis")
def test_a_user_past_their_own_limit_gets_a_429_naming_the_user_limit(settings):
    settings.JOBOPS_RATE_LIMITS = {**settings.JOBOPS_RATE_LIMITS, "create_per_user": 1}
    client = client_in(OrganisationFactory(slug="acme"))
    body = {"type": "sim", "params": {"steps": 1, "step_seconds": 0}}
    assert client.post("/api/v1/jobs", body, format="json").status_code == 201
    refused = client.post("/api/v1/jobs", body, format="json")
    assert refused.status_code == 429 and refused.json()["error"]["details"]["limit"] == "user"


def client_in(org):
    return client_for(UserFactory(org=org))


# --- logs and metrics name the tenant ------------------------------------------------------------


def test_worker_log_lines_of_a_job_carry_its_org_and_project(settings, json_log_lines):
    owner = member_of("acme")
    project = ProjectFactory(organisation=Organisation.objects.get(slug="acme"))
    scripted_table(settings, cam={"handler": f"{__name__}.records_its_run"})
    from jobs.services import job_create
    from tenants.selectors import Placement

    job, _ = job_create(
        owner=owner,
        job_type="cam",
        params={"do": "x"},
        placement=Placement(org_id=project.organisation_id, project_id=project.id),
    )
    job_execute(payload=wire_payload(job), hostname="t")
    lines = {line["event"]: line for line in json_log_lines() if line.get("job_id") == str(job.id)}
    for event in ("job_started", "job_succeeded"):
        assert lines[event]["org_id"] == str(job.org_id)
        assert lines[event]["project_id"] == str(project.id)
    # Bound for the run only: the next line of this process names no tenant.
    import structlog

    structlog.get_logger("t").info("after_the_run")
    (after,) = [line for line in json_log_lines() if line["event"] == "after_the_run"]
    assert "org_id" not in after


def test_a_held_jobs_log_line_names_its_organisation(settings, json_log_lines):
    job = queued_cam(settings, records_its_run, member_of("acme"))
    suspend(job.org_id)
    job_execute(payload=wire_payload(job), hostname="t")
    (line,) = [x for x in json_log_lines() if x["event"] == "job_held"]
    assert (line["org_id"], line["reason"]) == (str(job.org_id), "org_suspended")


@pytest.mark.usefixtures("clean_redis")
def test_api_create_log_lines_carry_the_org_and_project(json_log_lines):
    acme = OrganisationFactory(slug="acme")
    project = ProjectFactory(organisation=acme, slug="web")
    client = client_in(acme)
    body = {"type": "sim", "params": {"steps": 1, "step_seconds": 0}, "project": "web"}
    response = client.post("/api/v1/jobs", body, format="json")
    assert response.status_code == 201
    (line,) = [x for x in json_log_lines() if x["event"] == "job_created"]
    assert (line["org_id"], line["project_id"]) == (str(acme.id), str(project.id))


def _sample(name, labels):
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_metrics_have_no_tenant_label_by_default(django_capture_on_commit_callbacks):
    from jobs.integrations import metrics

    assert metrics.TENANT_LABELS == () and metrics.org_label(1) == {}
    labels = {"type": "sim", "status": "created"}
    before = _sample("job_create_total", labels)
    with django_capture_on_commit_callbacks(execute=True):
        make_job(owner=member_of("acme"))
    assert _sample("job_create_total", labels) == before + 1


# Run in a process of its own: the label names of a counter are fixed at import.
METRICS_SCRIPT = """
import django, json
django.setup()
from prometheus_client import REGISTRY
from django.db import transaction
from tests.factories import OrganisationFactory, UserFactory, job_in_state, make_job

def value(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0

acme = UserFactory(org=OrganisationFactory(slug="acme-m"))
globex = UserFactory(org=OrganisationFactory(slug="globex-m"))
out = {}
with transaction.atomic():
    make_job(owner=acme)
    make_job(owner=acme)
    make_job(owner=globex)
    job_in_state("succeeded", owner=acme)
out["acme_created"] = value("job_create_total", type="sim", status="created", org="acme-m")
out["other_created"] = value("job_create_total", type="sim", status="created", org="other")
out["acme_finished"] = value("job_finished_total", type="sim", status="succeeded", org="acme-m")
out["unlabelled"] = value("job_create_total", type="sim", status="created")
print(json.dumps(out))
"""


@pytest.mark.django_db(transaction=True)
def test_listed_organisations_get_an_org_label_on_the_create_and_finish_counters():
    env = subprocess_env(JOBOPS_METRICS_TENANT_LABELS="acme-m,absent")
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    done = run_python(METRICS_SCRIPT, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    values = json.loads(done.stdout.strip().splitlines()[-1])
    assert values == {
        "acme_created": 3.0,  # two, and the one job_in_state made
        "other_created": 1.0,  # globex is not listed
        "acme_finished": 1.0,
        "unlabelled": 0.0,  # with the setting, every sample has its org
    }
