"""Every read and write path tried as a user of another organisation: each answers
404 or shows nothing, never the other tenant's data.

Org A ("acme") has a job in every state, an artefact and a dead letter, its keys and
file names carrying a marker; org B ("globex") has its own member, admin and job, and
an operator limited to it. Each test walks one surface; `Tenants.leaks` looks for
anything of A (job and artefact ids, the marker) in whatever B got.
"""

from __future__ import annotations

import json

import pytest

from jobs.models import DeadLetter, Job
from jobs.services import artefact_save
from jobs.states import Status
from tenants.models import Membership, Role
from tests.factories import (
    OrganisationFactory,
    UserFactory,
    client_for,
    job_in_state,
)

pytestmark = pytest.mark.django_db

SECRET = "acme-secret-marker"


def _member(org, role: str = Role.MEMBER, **kwargs):
    user = UserFactory(org=False, **kwargs)
    Membership.objects.create(user=user, organisation=org, role=role)
    return user


class Tenants:
    """Org A's data and org B's people."""

    def __init__(self) -> None:
        self.acme = OrganisationFactory(slug="acme")
        self.globex = OrganisationFactory(slug="globex")
        self.a_owner = _member(self.acme)
        self.a_jobs: dict[str, Job] = {}
        for status in Status.values:
            self.a_jobs[status] = job_in_state(
                status,
                owner=self.a_owner,
                key=f"{SECRET}-{status}",
            )
        done = self.a_jobs[Status.SUCCEEDED]
        self.artefact = artefact_save(
            job_id=done.id, kind="report", name=f"{SECRET}.csv", data=SECRET.encode()
        )
        self.dead_letter = DeadLetter.objects.get(job=self.a_jobs[Status.FAILED])
        self.b_member = _member(self.globex)
        self.b_admin = _member(self.globex, Role.ADMIN)
        self.b_job = job_in_state(Status.SUCCEEDED, owner=self.b_member)

    def a_ids(self) -> set[str]:
        return {str(job.id) for job in self.a_jobs.values()} | {str(self.artefact.id)}

    def leaks(self, content: bytes | str) -> list[str]:
        text = content.decode("utf-8", "replace") if isinstance(content, bytes) else content
        found = [i for i in self.a_ids() if i in text]
        return found + ([SECRET] if SECRET in text else [])


@pytest.fixture
def t(settings) -> Tenants:
    return Tenants()


def _check_404(response, t: Tenants) -> None:
    assert response.status_code == 404, (response.status_code, response.content[:300])
    assert not t.leaks(response.content)


@pytest.mark.parametrize("who", ["b_member", "b_admin"])
def test_the_jobs_api_answers_404_for_every_url_of_another_organisations_job(t, who):
    client = client_for(getattr(t, who))
    for job in t.a_jobs.values():
        url = f"/api/v1/jobs/{job.id}"
        _check_404(client.get(url), t)
        _check_404(client.get(url, HTTP_IF_NONE_MATCH=job.etag), t)
        _check_404(client.head(url), t)
        _check_404(client.post(f"{url}/cancel"), t)
        _check_404(client.get(f"{url}/artefacts/{t.artefact.id}"), t)
    done = t.a_jobs[Status.SUCCEEDED]
    # B's own job id with A's artefact id: still nothing.
    _check_404(client.get(f"/api/v1/jobs/{t.b_job.id}/artefacts/{t.artefact.id}"), t)
    assert {j.status for j in Job.objects.filter(org=t.acme)} == set(Status.values)
    assert Job.objects.get(id=t.a_jobs[Status.PENDING].id).cancel_requested is False
    assert done.artefacts.count() == 1


@pytest.mark.parametrize("who", ["b_member", "b_admin"])
def test_lists_and_filters_show_nothing_of_another_organisation(t, who):
    client = client_for(getattr(t, who))
    queries = ["", "?status=failed", "?type=sim", "?category=planning", "?page_size=200"]
    for query in queries:
        response = client.get(f"/api/v1/jobs{query}")
        assert response.status_code == 200
        assert not t.leaks(response.content), query
    ids = {j["id"] for j in client.get("/api/v1/jobs").json()["results"]}
    assert ids == {str(t.b_job.id)}  # B's member owns it; B's admin sees B's every job


def test_the_same_idempotency_key_in_another_organisation_makes_a_new_job_and_leaks_nothing(t):
    client = client_for(t.b_member)
    key = f"{SECRET}-{Status.SUCCEEDED}"
    body = {"type": "sim", "params": {"steps": 1, "step_seconds": 0}, "idempotency_key": key}
    response = client.post("/api/v1/jobs", body, format="json")
    assert response.status_code == 201
    assert response.json()["org_id"] == t.globex.id
    assert response.json()["id"] not in t.a_ids()
    # Other params under that key: no mismatch error naming A's job either.
    again = client.post("/api/v1/jobs", {**body, "params": {"steps": 2}}, format="json")
    assert again.status_code == 422 and not t.leaks(again.content)
    assert again.json()["error"]["details"]["job_id"] == response.json()["id"]


def test_a_b_member_cannot_place_a_job_in_a(t):
    client = client_for(t.b_member)
    body = {"type": "sim", "params": {"steps": 1}, "org": "acme"}
    response = client.post("/api/v1/jobs", body, format="json")
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "ERR-TENANT-422"
    assert not Job.objects.filter(org=t.acme, owner=t.b_member).exists()


def test_event_payloads_name_only_their_own_organisation(t):
    from jobs.models import EventOutbox

    for event in EventOutbox.objects.filter(job_id__in=[j.id for j in t.a_jobs.values()]):
        assert event.payload["org_id"] == t.acme.id
    for event in EventOutbox.objects.filter(job_id=t.b_job.id):
        assert event.payload["org_id"] == t.globex.id
        assert not t.leaks(json.dumps(event.payload))
