"""Tenancy's foundation (docs/tenancy.md): where a job goes, who sees it, keys per
organisation, and the tenant in every audit entry and event of a job."""

from __future__ import annotations

import json
import uuid

import pytest
from django.db import connection
from django.utils import timezone

from audit.canonical import GENESIS_HASH, canonical_bytes, chain_hash
from audit.models import AuditLog
from audit.services import Actor, audit_payload, job_chain
from audit.verification import audit_verify
from jobs.domain.states import Status
from jobs.models import Job
from jobs.services import job_claim, job_succeed
from tenants.models import Membership, Role
from tests.factories import (
    OrganisationFactory,
    ProjectFactory,
    UserFactory,
    client_for,
    default_org,
    fence_of,
    job_in_state,
    make_job,
)

pytestmark = pytest.mark.django_db

SIM = {"type": "sim", "params": {"steps": 1, "step_seconds": 0}}


def _member(org, role: str = Role.MEMBER, **kwargs):
    user = UserFactory(org=False, **kwargs)
    Membership.objects.create(user=user, organisation=org, role=role)
    return user


@pytest.fixture
def acme():
    return OrganisationFactory(slug="acme")


@pytest.fixture
def globex():
    return OrganisationFactory(slug="globex")


# --- where a job goes ---------------------------------------------------------------


def test_a_caller_in_one_organisation_needs_to_name_none(acme):
    client = client_for(_member(acme))
    response = client.post("/api/v1/jobs", SIM, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["org_id"] == acme.id
    assert Job.objects.get(id=response.json()["id"]).org_id == acme.id


def test_a_caller_in_several_must_name_one_and_only_one_of_its_own(acme, globex):
    user = _member(acme)
    Membership.objects.create(user=user, organisation=globex)
    client = client_for(user)
    unnamed = client.post("/api/v1/jobs", SIM, format="json")
    assert unnamed.status_code == 422
    assert unnamed.json()["error"]["code"] == "ERR-TENANT-422"
    assert "acme, globex" in unnamed.json()["error"]["details"]["org"][0]
    named = client.post("/api/v1/jobs", {**SIM, "org": "globex"}, format="json")
    assert named.status_code == 201 and named.json()["org_id"] == globex.id
    OrganisationFactory(slug="initech")
    foreign = client.post("/api/v1/jobs", {**SIM, "org": "initech"}, format="json")
    assert foreign.status_code == 422
    assert foreign.json()["error"]["details"] == {"org": ["Not an organisation you belong to."]}
    # The same answer whether the organisation exists or not: no probing of slugs.
    missing = client.post("/api/v1/jobs", {**SIM, "org": "nosuch"}, format="json")
    assert missing.json()["error"] == foreign.json()["error"] | {
        "message": "'nosuch' is not an organisation of yours."
    }
    assert Job.objects.count() == 1


def test_a_project_must_belong_to_the_organisation(acme, globex):
    mine = ProjectFactory(organisation=acme, slug="web")
    ProjectFactory(organisation=globex, slug="billing")
    client = client_for(_member(acme))
    ok = client.post("/api/v1/jobs", {**SIM, "project": "web"}, format="json")
    assert ok.status_code == 201 and ok.json()["project_id"] == mine.id
    other = client.post("/api/v1/jobs", {**SIM, "project": "billing"}, format="json")
    assert other.status_code == 422
    assert other.json()["error"]["code"] == "ERR-TENANT-422"
    assert "project" in other.json()["error"]["details"]
    bad = client.post("/api/v1/jobs", {**SIM, "project": "not a slug!"}, format="json")
    assert bad.status_code == 400 and "project" in bad.json()["error"]["details"]


def test_a_suspended_organisation_takes_no_new_job_and_a_user_in_none_gets_403(acme):
    client = client_for(_member(acme))
    acme.suspended_at = timezone.now()
    acme.save()
    response = client.post("/api/v1/jobs", SIM, format="json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "ERR-TENANT-SUSPENDED"
    loner = client_for(UserFactory(org=False))
    response = loner.post("/api/v1/jobs", SIM, format="json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "ERR-TENANT-403"
    assert not Job.objects.exists()


# --- idempotency keys per organisation and owner --------------------------------------


def test_two_organisations_with_the_same_key_each_get_their_own_job(acme, globex):
    a, b = client_for(_member(acme)), client_for(_member(globex))
    body = {**SIM, "idempotency_key": "order-42"}
    first, second = (c.post("/api/v1/jobs", body, format="json") for c in (a, b))
    assert first.status_code == second.status_code == 201
    assert first.json()["id"] != second.json()["id"]
    again = a.post("/api/v1/jobs", body, format="json")
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]


def test_two_members_of_one_organisation_never_share_a_key(acme):
    alice, bob = client_for(_member(acme)), client_for(_member(acme))
    body = {**SIM, "idempotency_key": "k"}
    made = alice.post("/api/v1/jobs", body, format="json").json()["id"]
    theirs = bob.post("/api/v1/jobs", body, format="json")
    assert theirs.status_code == 201 and theirs.json()["id"] != made
    # Not even with other params: bob's key is his own, no mismatch with alice's.
    assert bob.get(f"/api/v1/jobs/{made}").status_code == 404


# --- visibility -------------------------------------------------------------------------


def test_a_member_of_another_organisation_gets_404_everywhere(acme, globex):
    owner, stranger = _member(acme), _member(globex)
    job = job_in_state(Status.SUCCEEDED, owner=owner)
    client = client_for(stranger)
    url = f"/api/v1/jobs/{job.id}"
    assert client.get(url).status_code == 404
    assert client.get(url, HTTP_IF_NONE_MATCH=job.etag).status_code == 404
    assert client.post(f"{url}/cancel").status_code == 404
    assert client.get("/api/v1/jobs").json()["results"] == []
    assert client_for(owner).get(url).status_code == 200


def test_org_admins_see_every_job_of_their_organisation_members_only_their_own(acme):
    alice, bob, admin = _member(acme), _member(acme), _member(acme, Role.ADMIN)
    job = make_job(owner=alice)
    assert client_for(bob).get(f"/api/v1/jobs/{job.id}").status_code == 404
    assert client_for(admin).get(f"/api/v1/jobs/{job.id}").status_code == 200
    listed = client_for(admin).get("/api/v1/jobs").json()["results"]
    assert [j["id"] for j in listed] == [str(job.id)]
    acme.shared_visibility = True
    acme.save()
    assert client_for(bob).get(f"/api/v1/jobs/{job.id}").status_code == 200
    assert [j["id"] for j in client_for(bob).get("/api/v1/jobs").json()["results"]] == [str(job.id)]


def test_leaving_an_organisation_hides_even_ones_own_jobs_there(acme):
    alice = _member(acme)
    job = make_job(owner=alice)
    Membership.objects.filter(user=alice).delete()
    assert client_for(alice).get(f"/api/v1/jobs/{job.id}").status_code == 404


# --- audit and events -----------------------------------------------------------------


def _entries(job) -> list[dict]:
    rows = AuditLog.objects.filter(chain=job_chain(job.id)).order_by("seq")
    return [json.loads(row.payload) for row in rows]


def test_every_audit_entry_of_a_job_names_its_tenant_actor_and_request(acme):
    project = ProjectFactory(organisation=acme, slug="web")
    client = client_for(_member(acme))
    created = client.post(
        "/api/v1/jobs",
        {**SIM, "project": "web"},
        format="json",
        HTTP_X_REQUEST_ID="req-create",
        HTTP_X_CORRELATION_ID="order-7",
    )
    assert created.headers["X-Correlation-ID"] == "order-7"
    assert created.headers["X-Request-ID"] == "req-create"
    job = Job.objects.get(id=created.json()["id"])
    assert (job.request_id, job.correlation_id) == ("req-create", "order-7")
    claimed = job_claim(job_id=job.id, locked_by="w1")
    job_succeed(job_id=job.id, fence=fence_of(claimed), result=None)
    entries = _entries(job)
    assert [e["event_type"] for e in entries] == ["created", "started", "succeeded"]
    context = {
        "correlation_id": "order-7",
        "job_type": "sim",
        "org_id": acme.id,
        "project_id": project.id,
    }
    assert entries[0]["data"]["context"] == context | {"request_id": "req-create"}
    # The worker's entries: no request made them.
    assert [e["data"]["context"] for e in entries[1:]] == [context | {"request_id": None}] * 2
    assert [e["data"]["attempt"] for e in entries] == [0, 1, 1]
    assert entries[0]["actor"]["type"] == "user" and entries[1]["actor"]["type"] == "system"
    assert audit_verify(job_ids=[job.id]).ok


def test_a_cancel_is_audited_with_its_own_request_id(acme):
    owner = _member(acme)
    job = make_job(owner=owner)
    client = client_for(owner)
    response = client.post(f"/api/v1/jobs/{job.id}/cancel", HTTP_X_REQUEST_ID="req-cancel")
    assert response.status_code in (200, 202), response.json()
    last = _entries(job)[-1]
    assert last["data"]["context"]["request_id"] == "req-cancel"
    assert last["data"]["context"]["correlation_id"] == job.correlation_id


def test_the_correlation_id_defaults_to_the_request_id_and_a_bad_one_is_replaced(acme):
    client = client_for(_member(acme))
    plain = client.post("/api/v1/jobs", SIM, format="json", HTTP_X_REQUEST_ID="r-1")
    assert plain.headers["X-Correlation-ID"] == "r-1"
    assert plain.json()["correlation_id"] == "r-1"
    forged = client.post(
        "/api/v1/jobs", SIM, format="json", HTTP_X_REQUEST_ID="r-2",
        HTTP_X_CORRELATION_ID="evil\r\nX-Injected: 1",
    )  # fmt: skip
    assert forged.headers["X-Correlation-ID"] == "r-2"
    assert forged.json()["correlation_id"] == "r-2"


def test_a_context_with_characters_json_escapes_hashes_as_python_writes_it(acme):
    # The context is written by SQL (jobs_audit_context); a correlation id never holds
    # these (it is checked at the edge), but a job made by a command could: the bytes
    # must still be the canonical ones the verifier recomputes.
    owner = _member(acme)
    job = make_job(owner=owner)
    Job.objects.filter(id=job.id).update(correlation_id='q"u\\o\n\x01té')
    job_claim(job_id=job.id, locked_by="w1")
    entry = AuditLog.objects.get(chain=job_chain(job.id), seq=2)
    assert json.loads(entry.payload)["data"]["context"]["correlation_id"] == 'q"u\\o\n\x01té'
    assert entry.payload.encode() == canonical_bytes(json.loads(entry.payload))
    assert audit_verify(job_ids=[job.id]).ok


def test_the_verifier_passes_a_chain_begun_before_tenancy_and_continued_after():
    # A job whose first entry has the shape written before tenancy (no context), as the
    # migration leaves every existing chain; its next entries carry the context.
    owner = UserFactory()
    job = Job(
        type="sim", category="sim", queue="sim", params={}, params_hash="0", owner=owner,
        org=default_org(), max_attempts=3,
    )  # fmt: skip
    job.save()
    ts = timezone.now()
    payload = canonical_bytes(
        audit_payload(
            chain=job_chain(job.id), seq=1, ts=ts, event_type="created",
            actor=Actor.user(owner), job_id=job.id,
            data={"from": None, "to": "pending", "attempt": 0},
        )
    )  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM audit_append(%s, %s, 1, 'created', 'user', %s, %s, %s, %s)",
            [job_chain(job.id), job.id, str(owner.pk), ts, payload.decode(), GENESIS_HASH],
        )
    Job.objects.filter(id=job.id).update(audit_seq=1, audit_head=chain_hash(GENESIS_HASH, payload))
    claimed = job_claim(job_id=job.id, locked_by="w1")
    job_succeed(job_id=job.id, fence=fence_of(claimed), result=None)
    entries = _entries(job)
    assert "context" not in entries[0]["data"]
    assert all("context" in e["data"] for e in entries[1:])
    report = audit_verify(job_ids=[job.id])
    assert report.ok, report.problems
    assert report.rows_checked == 3


def test_the_status_event_names_the_organisation_and_project(acme):
    from jobs.models import EventOutbox

    project = ProjectFactory(organisation=acme)
    owner = _member(acme)
    client = client_for(owner)
    made = client.post("/api/v1/jobs", {**SIM, "project": project.slug}, format="json")
    event = EventOutbox.objects.get(job_id=uuid.UUID(made.json()["id"]), seq=1)
    assert (event.payload["org_id"], event.payload["project_id"]) == (acme.id, project.id)


def test_submit_job_names_the_organisation_and_project_of_an_owner_in_several(acme, globex):
    import io

    from django.core.management import call_command
    from django.core.management.base import CommandError

    owner = _member(acme, username="multi")
    Membership.objects.create(user=owner, organisation=globex)
    ProjectFactory(organisation=globex, slug="billing")
    args = ["submit_job", "--type", "sim", "--params", '{"steps": 1}', "--owner", "multi"]
    with pytest.raises(CommandError, match="ERR-TENANT-422"):
        call_command(*args, stdout=io.StringIO())
    out = io.StringIO()
    call_command(*args, "--org", "globex", "--project", "billing", stdout=out)
    job = Job.objects.get(id=out.getvalue().split()[0])
    assert (job.org_id, job.project.slug) == (globex.id, "billing")


def test_an_org_admin_cancels_a_members_job_audited_as_a_user_a_member_cannot(acme):
    alice, bob, admin = _member(acme), _member(acme), _member(acme, Role.ADMIN)
    acme.shared_visibility = True
    acme.save()
    job = make_job(owner=alice)
    refused = client_for(bob).post(f"/api/v1/jobs/{job.id}/cancel")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "ERR-AUTH-403"
    assert Job.objects.get(id=job.id).status == Status.PENDING
    done = client_for(admin).post(f"/api/v1/jobs/{job.id}/cancel")
    assert done.status_code in (200, 202) and done.json()["status"] == "cancelled"
    last = _entries(job)[-1]
    assert last["event_type"] == "cancelled"
    # Not staff: the admin acts as a person of the organisation, not as an operator.
    assert last["actor"] == {"type": "user", "id": str(admin.pk)}


def test_the_schema_documents_the_correlation_header_and_the_tenant_fields(client):
    schema = client.get("/api/v1/schema/", HTTP_ACCEPT="application/json").json()
    create = schema["paths"]["/api/v1/jobs"]["post"]
    headers = {p["name"] for p in create["parameters"] if p["in"] == "header"}
    assert {"X-Request-ID", "X-Correlation-ID"} <= headers
    body = schema["components"]["schemas"]["JobCreateInputRequest"]["properties"]
    assert {"org", "project"} <= set(body)
    output = schema["components"]["schemas"]["JobOutput"]["properties"]
    assert {"org_id", "project_id", "correlation_id"} <= set(output)
    codes = json.dumps(create["responses"])
    assert "ERR-TENANT-SUSPENDED" in codes and "ERR-TENANT-422" in codes


def test_the_audit_context_function_is_inlined_into_the_statement():
    # A SQL function the planner does not inline is planned again at every execution of
    # the transition statement that calls it: 0.5 ms of every claim and finish.
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (VERBOSE) SELECT jobs_audit_context(j, 'r') FROM jobs j")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "jobs_audit_context" not in plan and "to_json" in plan
