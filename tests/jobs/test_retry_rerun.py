"""Retry and re-run (docs/operator-controls.md#retry-and-re-run): the owner's
POST /api/v1/jobs/{id}/retry of a failed job, and an operator's re-run of a finished job
as a new job that names it."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from audit.models import AuditLog
from audit.services import job_chain
from audit.verification import audit_verify
from jobs.domain.states import Status
from jobs.models import DeadLetter, DeadLetterState, Job
from jobs.services import job_rerun
from tenants.models import Scope
from tenants.services import token_create
from tests.factories import (
    OperatorFactory,
    OrganisationFactory,
    StaffFactory,
    UserFactory,
    client_for,
    job_failed,
    job_in_state,
    otp_login,
)

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/jobs"


def retry(client: APIClient, job: Job, body=None):
    return client.post(f"{JOBS}/{job.id}/retry", body, format="json")


def entries(job: Job) -> list[AuditLog]:
    return list(AuditLog.objects.filter(chain=job_chain(job.id)).order_by("seq"))


def data(entry: AuditLog) -> dict:
    return json.loads(entry.payload)["data"]


def test_the_owner_retries_a_failed_job_under_a_replays_rules():
    job = job_failed(code="BOOM")
    row = DeadLetter.objects.get(job=job)
    before = Job.objects.get(id=job.id)
    response = retry(client_for(job.owner), job)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["id"] == str(job.id) and body["status"] == "pending"
    after = Job.objects.get(id=job.id)
    # Attempts keep counting; the budget grows by the type's max_attempts.
    assert after.attempts == before.attempts == 1
    assert after.max_attempts == before.max_attempts * 2
    assert after.dead_letter_queue is None and after.result is None
    row.refresh_from_db()
    assert row.state == DeadLetterState.REPLAYED
    assert row.resolved_by_id == job.owner.pk and row.justification == "retried by owner"
    last = entries(job)[-1]
    assert last.event_type == "retried" and last.actor_type == "user"
    assert data(last)["dead_letter_id"] == row.id and data(last)["to"] == "pending"
    assert "retried by owner" not in str(data(last))  # the digest, not the text
    assert audit_verify(job_ids=[job.id]).ok


def test_a_retry_keeps_the_callers_reason_on_the_dead_letter():
    job = job_failed()
    assert retry(client_for(job.owner), job, {"reason": "upstream fixed"}).status_code == 200
    assert DeadLetter.objects.get(job=job).justification == "upstream fixed"


@pytest.mark.parametrize(
    "body, field",
    [({"reason": "x" * 1001}, "reason"), ({"reason": 5}, "reason"), ({"status": "x"}, "status")],
)
def test_bad_input_is_400_and_changes_nothing(body, field):
    job = job_failed()
    response = retry(client_for(job.owner), job, body)
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["details"]
    assert Job.objects.get(id=job.id).status == Status.FAILED


@pytest.mark.parametrize(
    "state", ["pending", "queued", "running", "retrying", "succeeded", "cancelled"]
)
def test_other_states_answer_409_with_the_status(state):
    job = job_in_state(state)
    response = retry(client_for(job.owner), job)
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "ERR-JOB-409" and error["details"]["status"] == state
    assert Job.objects.get(id=job.id).status == state


def test_a_second_retry_answers_409_pending():
    job = job_failed()
    client = client_for(job.owner)
    assert retry(client, job).status_code == 200
    again = retry(client, job)
    assert again.status_code == 409 and again.json()["error"]["details"]["status"] == "pending"
    assert [e.event_type for e in entries(job)].count("retried") == 1


def test_another_member_or_organisation_gets_404():
    job = job_failed()
    member = UserFactory()  # same (default) organisation, not the owner, not an admin
    outsider = UserFactory(org=OrganisationFactory())
    for user in (member, outsider):
        response = retry(client_for(user), job)
        assert response.status_code == 404, (user, response.content)
    assert Job.objects.get(id=job.id).status == Status.FAILED


def test_an_org_admin_retries_a_members_job_as_themselves_not_as_an_operator():
    job = job_failed()
    admin = UserFactory(org__role="admin")
    assert not admin.is_staff
    assert retry(client_for(admin), job).status_code == 200
    assert (entries(job)[-1].actor_type, entries(job)[-1].actor_id) == ("user", str(admin.pk))
    assert DeadLetter.objects.get(job=job).resolved_by_id == admin.pk


def test_the_retry_needs_the_jobs_write_scope():
    job = job_failed()
    read_only = token_create(user=job.owner, name="ro", scopes=[Scope.JOBS_READ]).key
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {read_only}")
    response = retry(client, job)
    assert response.status_code == 403
    assert response.json()["error"]["details"]["required_scope"] == Scope.JOBS_WRITE
    writer = token_create(user=job.owner, name="rw", scopes=[Scope.JOBS_WRITE]).key
    client.credentials(HTTP_AUTHORIZATION=f"Token {writer}")
    assert retry(client, job).status_code == 200


@pytest.mark.usefixtures("clean_redis")
def test_retries_share_the_create_rate_limit(settings):
    settings.JOBOPS_RATE_LIMITS = {**settings.JOBOPS_RATE_LIMITS, "create_per_user": 2}
    owner = UserFactory()
    job = job_failed()
    Job.objects.filter(id=job.id).update(owner=owner)
    client = client_for(owner)
    created = client.post(JOBS, {"type": "sim", "params": {"steps": 1}}, format="json")
    assert created.status_code == 201
    first = retry(client, job)
    assert first.status_code == 200 and "RateLimit-Remaining" in first.headers
    refused = retry(client, job)
    assert refused.status_code == 429 and "Retry-After" in refused.headers


def test_the_schema_documents_the_retry_with_its_errors(api):
    schema = api.get("/api/v1/schema/", HTTP_ACCEPT="application/json").json()
    operation = schema["paths"]["/api/v1/jobs/{job_id}/retry"]["post"]
    assert {"200", "400", "404", "409", "429"} <= set(operation["responses"])
    body = schema["components"]["schemas"]["JobOutput"]["properties"]
    assert "rerun_of" in body


# --- re-run --------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["succeeded", "cancelled", "failed"])
def test_an_operator_reruns_a_finished_job_as_a_linked_new_job(state):
    original = job_in_state(state)
    Job.objects.filter(id=original.id).update(priority=8)  # made by staff, say
    original.refresh_from_db()
    operator = OperatorFactory()
    new = job_rerun(job_id=original.id, actor_user=operator, justification="customer asked")
    assert new.id != original.id and new.status == Status.PENDING
    assert new.rerun_of_id == original.id
    assert (new.type, new.params, new.owner_id, new.org_id, new.project_id, new.priority) == (
        original.type,
        original.params,
        original.owner_id,
        original.org_id,
        original.project_id,
        8,
    )
    assert Job.objects.get(id=original.id).status == state  # the original stays as it was
    created = entries(new)[0]
    assert created.event_type == "created" and data(created)["rerun_of"] == str(original.id)
    assert created.actor_type == "operator"
    rerun = entries(original)[-1]
    assert rerun.event_type == "rerun" and data(rerun)["rerun_job_id"] == str(new.id)
    assert audit_verify(job_ids=[original.id, new.id]).ok
    body = client_for(original.owner).get(f"{JOBS}/{new.id}").json()
    assert body["rerun_of"] == str(original.id)


def test_a_rerun_needs_an_operator_a_finished_job_and_a_justification():
    original = job_in_state("succeeded")
    for user in (original.owner, StaffFactory()):
        with pytest.raises(Exception) as refused:
            job_rerun(job_id=original.id, actor_user=user, justification="x")
        assert refused.value.code == "ERR-AUTH-403"
    with pytest.raises(Exception) as missing:
        job_rerun(job_id=original.id, actor_user=OperatorFactory(), justification="  ")
    assert missing.value.code == "ERR-JOB-400"
    running = job_in_state("running")
    with pytest.raises(Exception) as busy:
        job_rerun(job_id=running.id, actor_user=OperatorFactory(), justification="x")
    assert busy.value.code == "ERR-JOB-409"
    assert not Job.objects.filter(rerun_of__isnull=False).exists()


def test_a_limited_operator_reruns_only_jobs_of_their_organisations():
    from tenants.models import OperatorScope

    original = job_in_state("succeeded")
    operator = OperatorFactory()
    scope = OperatorScope.objects.create(user=operator)
    scope.organisations.add(OrganisationFactory())
    with pytest.raises(Exception) as hidden:
        job_rerun(job_id=original.id, actor_user=operator, justification="x")
    assert hidden.value.code == "ERR-JOB-404"


def test_the_admin_job_pages_rerun_and_link_both_ways(client):
    from tests.factories import role_user

    original = job_in_state("succeeded")
    otp_login(client, role_user("operator"))
    from django.urls import reverse

    page = reverse("admin:jobs_job_change", args=[original.id])
    rerun = reverse("admin:jobs_job_rerun", args=[original.id])
    assert 'id="rerun-job"' in client.get(page).content.decode()
    refused = client.post(rerun, {"justification": ""})
    assert refused.status_code == 200 and 'id="rerun-error"' in refused.content.decode()
    done = client.post(rerun, {"justification": "again please"})
    assert done.status_code == 302
    new = Job.objects.get(rerun_of=original)
    assert done["Location"] == reverse("admin:jobs_job_change", args=[new.id])
    assert str(new.id) in client.get(page).content.decode()  # the original links its re-run
    assert str(original.id) in client.get(done["Location"]).content.decode()
    viewer = otp_login(client, role_user("viewer"))
    assert viewer and 'id="rerun-job"' not in client.get(page).content.decode()
    assert client.post(rerun, {"justification": "x"}).status_code == 403
