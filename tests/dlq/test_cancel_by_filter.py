"""Cancel by filter (docs/operator-controls.md#bulk-cancel): the service, the background
run, the admin API and the portal page."""

from __future__ import annotations

import json

import pytest
from django.core.cache import cache
from django.test import Client
from rest_framework.test import APIClient

from audit.models import AuditLog
from dlq.bulk import bulk_operations_run_once
from dlq.models import BulkOperation
from dlq.services.cancel import jobs_cancel_by_filter
from jobs.domain.states import Status
from jobs.models import Job
from jobs.selectors import JobFilter
from tenants.models import OperatorScope
from tests.factories import OrganisationFactory, make_job, otp_login, role_user

pytestmark = pytest.mark.django_db
API = "/api/v1/admin/jobs/cancel"


@pytest.fixture(autouse=True)
def _fresh_limits():
    cache.clear()


def _jobs(n: int, steps: int = 2, org=None) -> list[Job]:
    jobs = [make_job(params={"steps": steps, "step_seconds": 0}) for _ in range(n)]
    if org is not None:
        Job.objects.filter(id__in=[j.id for j in jobs]).update(org=org)
    return jobs


def _api(user) -> APIClient:
    return otp_login(APIClient(), user)


def test_dry_run_counts_and_changes_nothing():
    _jobs(3, steps=4)
    _jobs(2, steps=5)
    operator = role_user("operator")
    dry = jobs_cancel_by_filter(
        actor_user=operator, filters=JobFilter(params={"steps": 4}), dry_run=True
    )
    assert dry.matched == 3 and len(dry.sample) == 3
    assert not Job.objects.filter(status=Status.CANCELLED).exists()


def test_a_small_cancel_runs_now_audited_as_the_operator():
    chosen, others = _jobs(2, steps=4), _jobs(1, steps=5)
    operator = role_user("operator")
    done = jobs_cancel_by_filter(
        actor_user=operator, filters=JobFilter(params={"steps": 4}), justification="sick ERP"
    )
    assert done.cancelled == 2
    assert set(Job.objects.filter(status=Status.CANCELLED).values_list("id", flat=True)) == {
        j.id for j in chosen
    }
    assert Job.objects.get(id=others[0].id).status == Status.PENDING
    entries = AuditLog.objects.filter(event_type="cancelled", actor_type="operator")
    assert entries.count() == 2 and {e.actor_id for e in entries} == {str(operator.pk)}
    request = json.loads(AuditLog.objects.get(event_type="jobs_cancel_by_filter").payload)
    assert '"matched":2' in json.dumps(request, separators=(",", ":"))
    assert "sick ERP" in json.dumps(request)


def test_a_large_cancel_runs_in_the_background_until_done(settings):
    settings.JOBOPS_DLQ_BACKGROUND_THRESHOLD = 2
    _jobs(5, steps=4)
    operator = role_user("operator")
    operation = jobs_cancel_by_filter(
        actor_user=operator, filters=JobFilter(params={"steps": 4}), justification="incident"
    )
    assert isinstance(operation, BulkOperation) and operation.total == 5
    assert Job.objects.filter(status=Status.PENDING).count() == 5
    late = _jobs(1, steps=4)[0]  # created after the start: not chased
    for _ in range(5):
        bulk_operations_run_once(chunk=2)
    operation.refresh_from_db()
    assert operation.state == "done" and operation.processed == 5 and operation.resolved == 5
    assert Job.objects.filter(status=Status.CANCELLED).count() == 5
    assert Job.objects.get(id=late.id).status == Status.PENDING


def test_justification_is_required_and_viewers_are_refused():
    _jobs(1)
    operator, viewer = role_user("operator"), role_user("viewer", username="vic")
    missing = _api(operator).post(API, {"filter": {"type": "sim"}}, format="json")
    assert missing.status_code == 422 and missing.json()["error"]["code"] == "ERR-DLQ-422"
    refused = _api(viewer).post(API, {"justification": "x", "dry_run": True}, format="json")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "ERR-DLQ-403"


def test_the_api_dry_runs_runs_and_starts_background_operations(settings):
    _jobs(2, steps=4)
    api = _api(role_user("operator"))
    body = {"filter": {"type": "sim", "params": {"steps": 4}}, "justification": "why"}
    dry = api.post(API, {**body, "dry_run": True}, format="json")
    assert dry.status_code == 200 and dry.json()["matched"] == 2, dry.content
    run = api.post(API, body, format="json")
    assert run.status_code == 200 and run.json()["cancelled"] == 2
    settings.JOBOPS_DLQ_BACKGROUND_THRESHOLD = 1
    _jobs(3, steps=4)
    large = api.post(API, body, format="json")
    assert large.status_code == 202 and large.json()["action"] == "cancel"
    assert large["Location"].endswith(f"/api/v1/admin/dlq/operations/{large.json()['id']}")


@pytest.mark.parametrize(
    "body",
    [
        {"filter": {"status": "nope"}},
        {"filter": {"type": "/"}},
        {"filter": {"queue": "nowhere"}},
        {"filter": {"created_after": "yesterday"}},
        {"filter": {"unknown": 1}},
        {"filter": {"owner": "u" * 151}},
        {"dry_run": "yes"},
    ],
)
def test_bad_filter_bodies_are_400_in_the_envelope(body):
    answer = _api(role_user("operator")).post(API, {"justification": "x", **body}, format="json")
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"]["code"] == "ERR-DLQ-400"


@pytest.mark.parametrize(
    "wanted",
    [
        {"params": []},
        {"params": {"a": {"b": {"c": {"d": {"e": 1}}}}}},
        {"params": {"a": "x" * 1001}},
        {"created_after": "2026-01-02T00:00:00Z", "created_before": "2026-01-01T00:00:00Z"},
    ],
)
def test_a_well_formed_filter_no_job_can_match_is_a_422_and_cancels_nothing(wanted):
    # The schema cannot say these (depth, size, an empty range): the body is well-formed,
    # so the answer is 422, as the OpenAPI contract test expects of schema-valid bodies.
    job = _jobs(1)[0]
    answer = _api(role_user("operator")).post(
        API, {"justification": "x", "filter": wanted}, format="json"
    )
    assert answer.status_code == 422, answer.content
    assert answer.json()["error"]["code"] == "ERR-DLQ-422"
    assert Job.objects.get(id=job.id).status != "cancelled"


def test_a_limited_operator_cancels_only_in_their_organisations():
    mine, other = OrganisationFactory(), OrganisationFactory()
    ours, theirs = _jobs(2, org=mine), _jobs(2, org=other)
    bea = role_user("operator", username="bea")
    OperatorScope.objects.create(user=bea).organisations.add(mine)
    api = _api(bea)
    # No org in the filter: narrowed to hers, never every tenant.
    dry = api.post(API, {"dry_run": True}, format="json")
    assert dry.status_code == 200 and dry.json()["matched"] == 2
    outside = api.post(API, {"filter": {"org": other.slug}, "justification": "x"}, format="json")
    assert outside.status_code == 404 and outside.json()["error"]["code"] == "ERR-DLQ-404"
    unknown = api.post(API, {"filter": {"org": "no-such-org"}, "dry_run": True}, format="json")
    assert unknown.status_code == 404
    run = api.post(API, {"justification": "x"}, format="json")
    assert run.status_code == 200 and run.json()["cancelled"] == 2
    assert {j.id for j in ours} == set(
        Job.objects.filter(status=Status.CANCELLED).values_list("id", flat=True)
    )
    assert all(Job.objects.get(id=j.id).status == Status.PENDING for j in theirs)


def test_the_portal_counts_first_then_cancels_all_matching():
    _jobs(2, steps=6)
    _jobs(1, steps=7)
    portal = otp_login(Client(), role_user("operator"))
    listing = portal.get("/admin/jobs/job/", {"q": "param:steps=6"})
    assert b"Cancel all matching" in listing.content
    url = "/admin/dlq/bulkoperation/cancel-jobs/?q=param%3Asteps%3D6"
    page = portal.get(url)
    assert page.status_code == 200 and b"<strong>2</strong> unfinished jobs" in page.content
    refused = portal.post(url, {"justification": " "})
    assert b"justification is required" in refused.content
    assert not Job.objects.filter(status=Status.CANCELLED).exists()
    done = portal.post(url, {"justification": "bad batch"})
    assert done.status_code == 302
    assert Job.objects.filter(status=Status.CANCELLED).count() == 2
    unsupported = portal.get("/admin/dlq/bulkoperation/cancel-jobs/?dead_letter=open")
    assert unsupported.status_code == 302


def test_viewers_get_no_cancel_all_matching():
    portal = otp_login(Client(), role_user("viewer"))
    assert b"Cancel all matching" not in portal.get("/admin/jobs/job/").content
    assert portal.get("/admin/dlq/bulkoperation/cancel-jobs/").status_code == 403


def test_a_background_cancel_says_it_handles_jobs_not_dead_letters(settings):
    settings.JOBOPS_DLQ_BACKGROUND_THRESHOLD = 2
    _jobs(3, steps=8)
    operator = role_user("operator")
    portal = otp_login(Client(), operator)
    portal.post(
        "/admin/dlq/bulkoperation/cancel-jobs/?q=param%3Asteps%3D8", {"justification": "INC-7"}
    )
    operation = BulkOperation.objects.get(action="cancel")
    page = portal.get(f"/admin/dlq/bulkoperation/{operation.id}/change/").content.decode()
    assert "cancel of 3 jobs" in page and "0 cancelled" in page and "dead letter" not in page
    stop = portal.post(f"/admin/dlq/bulkoperation/{operation.id}/stop/", follow=True)
    assert [str(m) for m in stop.context["messages"]] == [
        "The cancel is stopped (0 of 3 jobs handled)."
    ]
    assert "dead letter" not in stop.content.decode()
