"""The project in an idempotency key's fingerprint (docs/tenancy.md#idempotency-keys):
a repeat naming another project is a mismatch on the single create, the batch create
and submit_job; and `manage.py org project` makes the projects they name."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from audit.models import AuditLog
from jobs.models import Job
from tenants.models import Membership, Project, Role
from tests.factories import OrganisationFactory, ProjectFactory, UserFactory, client_for

pytestmark = pytest.mark.django_db

SIM = {"type": "sim", "params": {"steps": 1, "step_seconds": 0}}
MISMATCH = "ERR-JOB-IDEMPOTENCY-MISMATCH"


@pytest.fixture
def acme():
    return OrganisationFactory(slug="acme")


@pytest.fixture
def member(acme):
    user = UserFactory(org=False, username="alice")
    Membership.objects.create(user=user, organisation=acme, role=Role.MEMBER)
    return user


def org(*args: str) -> str:
    out = io.StringIO()
    call_command("org", *args, stdout=out)
    return out.getvalue()


def test_a_repeat_in_another_project_is_a_mismatch_never_the_first_projects_job(acme, member):
    web, billing = (ProjectFactory(organisation=acme, slug=s) for s in ("web", "billing"))
    client = client_for(member)
    body = {**SIM, "idempotency_key": "order-42"}
    made = client.post("/api/v1/jobs", {**body, "project": "web"}, format="json")
    assert made.status_code == 201 and made.json()["project_id"] == web.id
    job_id = made.json()["id"]
    for other in ({"project": "billing"}, {}):
        answer = client.post("/api/v1/jobs", {**body, **other}, format="json")
        assert answer.status_code == 422, answer.json()
        assert answer.json()["error"]["code"] == MISMATCH
        assert answer.json()["error"]["details"] == {"job_id": job_id, "project_id": web.id}
    # The key marks itself seen only on a true repeat: a mismatch leaves it as it was.
    assert Job.objects.get(id=job_id).idempotency_last_seen_at is None
    again = client.post("/api/v1/jobs", {**body, "project": "web"}, format="json")
    assert again.status_code == 200 and again.json()["id"] == job_id
    assert Job.objects.get(id=job_id).idempotency_last_seen_at is not None
    # A key first used without a project is refused in one, and repeats without.
    bare = client.post("/api/v1/jobs", {**SIM, "idempotency_key": "bare"}, format="json")
    moved = client.post(
        "/api/v1/jobs", {**SIM, "idempotency_key": "bare", "project": "billing"}, format="json"
    )
    assert moved.status_code == 422
    assert moved.json()["error"]["details"] == {"job_id": bare.json()["id"], "project_id": None}
    assert Job.objects.filter(project=billing).count() == 0
    assert Job.objects.count() == 2


def test_a_batch_compares_the_project_per_item_and_between_its_items(acme, member):
    web = ProjectFactory(organisation=acme, slug="web")
    ProjectFactory(organisation=acme, slug="billing")
    client = client_for(member)
    single = client.post(
        "/api/v1/jobs", {**SIM, "idempotency_key": "k1", "project": "web"}, format="json"
    ).json()
    items = [
        {**SIM, "idempotency_key": "k1", "project": "web"},  # the single create's job
        {**SIM, "idempotency_key": "k1", "project": "billing"},  # another project: 422
        {**SIM, "idempotency_key": "k2", "project": "web"},  # new
        {**SIM, "idempotency_key": "k2"},  # the earlier item's key, no project: 422
        {**SIM, "idempotency_key": "k2", "project": "web"},  # the earlier item's job
    ]
    response = client.post("/api/v1/jobs/batch", {"jobs": items}, format="json")
    assert response.status_code == 200, response.content
    listed = response.json()["results"]
    assert [r["status"] for r in listed] == ["existing", "error", "created", "error", "existing"]
    assert listed[0]["id"] == single["id"]
    assert listed[1]["error"]["code"] == MISMATCH
    assert listed[1]["error"]["details"] == {"index": 0, "job_id": single["id"]}
    assert listed[3]["error"]["code"] == MISMATCH
    assert listed[3]["error"]["details"] == {"index": 2, "job_id": listed[2]["id"]}
    assert listed[4]["id"] == listed[2]["id"]
    # Alone in its batch, the item is compared with the stored job.
    alone = client.post(
        "/api/v1/jobs/batch",
        {"jobs": [{**SIM, "idempotency_key": "k1", "project": "billing"}]},
        format="json",
    ).json()["results"][0]
    assert alone["error"]["code"] == MISMATCH
    assert alone["error"]["details"] == {"job_id": single["id"], "project_id": web.id}
    assert Job.objects.count() == 2


def test_submit_job_refuses_a_key_repeated_in_another_project(acme, member):
    ProjectFactory(organisation=acme, slug="web")
    ProjectFactory(organisation=acme, slug="billing")
    args = ["submit_job", "--type", "sim", "--params", '{"steps": 1}', "--owner", "alice"]
    out = io.StringIO()
    call_command(*args, "--key", "nightly", "--project", "web", stdout=out)
    with pytest.raises(CommandError, match=MISMATCH):
        call_command(*args, "--key", "nightly", "--project", "billing", stdout=io.StringIO())
    again = io.StringIO()
    call_command(*args, "--key", "nightly", "--project", "web", stdout=again)
    assert again.getvalue().split()[0] == out.getvalue().split()[0]
    assert Job.objects.count() == 1


def test_org_project_makes_a_project_once_audited_and_jobs_go_into_it(acme, member):
    assert "created project acme/web (Web shop)" in org(
        "project", "acme", "web", "--name", "Web shop"
    )
    project = Project.objects.get(organisation=acme, slug="web")
    assert project.name == "Web shop"
    with pytest.raises(CommandError, match="has a project 'web' already"):
        org("project", "acme", "web")
    with pytest.raises(CommandError, match="'no good'"):
        org("project", "acme", "no good")
    with pytest.raises(CommandError, match="No organisation 'nope'"):
        org("project", "nope", "web")
    assert "created project acme/api (api)" in org("project", "acme", "api")
    entries = [
        json.loads(e.payload)
        for e in AuditLog.objects.filter(chain="ops", event_type="project_created").order_by("seq")
    ]
    assert [e["data"]["slug"] for e in entries] == ["web", "api"]
    made = client_for(member).post("/api/v1/jobs", {**SIM, "project": "web"}, format="json")
    assert made.status_code == 201 and made.json()["project_id"] == project.id
