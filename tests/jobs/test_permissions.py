"""Changing something needs its permission: a staff user who may only view is refused."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django_celery_results.models import TaskResult
from django_otp.plugins.otp_totp.models import TOTPDevice
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from dlq.errors import DeadLetterPermissionError
from dlq.services.replay import dead_letters_discard, dead_letters_replay
from jobs.domain.states import Status
from jobs.models import Job
from jobs.services import artefact_save
from tests.factories import (
    OperatorFactory,
    StaffFactory,
    UserFactory,
    client_for,
    client_with_grant,
    make_job,
    otp_login,
    role_user,
)

pytestmark = pytest.mark.django_db

VIEW_PERMS = ["view_job", "view_deadletter", "view_auditlog", "view_taskresult", "view_totpdevice"]


@pytest.fixture
def viewer_client(client):
    user = StaffFactory()
    user.user_permissions.add(*Permission.objects.filter(codename__in=VIEW_PERMS))
    return otp_login(client, user)


@pytest.fixture
def operator_client(client):
    user = OperatorFactory()
    user.user_permissions.add(*Permission.objects.filter(codename__in=VIEW_PERMS))
    return otp_login(client, user)


def _cancel_action(client, job):
    return client.post(
        "/admin/jobs/job/",
        {"action": "cancel_jobs", "_selected_action": [str(job.id)], "confirm": "yes"},
    )


def test_a_viewer_is_not_offered_cancel_and_cannot_run_it(viewer_client):
    job = make_job()
    page = viewer_client.get("/admin/jobs/job/")
    assert page.status_code == 200 and b"cancel_jobs" not in page.content
    _cancel_action(viewer_client, job)
    assert Job.objects.get(id=job.id).status == Status.PENDING


def test_an_operator_cancels_from_the_admin(operator_client):
    job = make_job()
    assert b"cancel_jobs" in operator_client.get("/admin/jobs/job/").content
    _cancel_action(operator_client, job)
    assert Job.objects.get(id=job.id).status == Status.CANCELLED


def test_a_viewer_cannot_edit_job_results_or_devices(viewer_client):
    job = make_job()
    result = TaskResult.objects.create(task_id="t-1", status="SUCCESS")
    device = TOTPDevice.objects.create(user=UserFactory(), name="x", confirmed=True)
    for url, data in [
        (f"/admin/jobs/job/{job.id}/change/", {"status": "succeeded"}),
        (f"/admin/django_celery_results/taskresult/{result.pk}/change/", {"status": "FAILURE"}),
        (f"/admin/django_celery_results/taskresult/{result.pk}/delete/", {"post": "yes"}),
        (f"/admin/otp_totp/totpdevice/{device.pk}/change/", {"name": "mine"}),
        (f"/admin/otp_totp/totpdevice/{device.pk}/delete/", {"post": "yes"}),
    ]:
        assert viewer_client.post(url, data).status_code == 403, url
    assert TaskResult.objects.get(pk=result.pk).status == "SUCCESS"
    assert TOTPDevice.objects.get(pk=device.pk).name == "x"


def test_replay_and_discard_need_their_permission():
    staff = StaffFactory()
    for action in (dead_letters_replay, dead_letters_discard):
        with pytest.raises(DeadLetterPermissionError):
            action(actor_user=staff, justification="why", job_ids=[])
    operator = OperatorFactory()
    assert dead_letters_replay(actor_user=operator, justification="why", job_ids=[]).matched == 0


def test_staff_cancel_someone_elses_job_through_the_api_only_with_the_permission():
    job = make_job(owner=UserFactory())
    refused = client_with_grant(role_user("viewer")).post(f"/api/v1/jobs/{job.id}/cancel")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "ERR-AUTH-403"
    assert Job.objects.get(id=job.id).status == Status.PENDING
    allowed = client_with_grant(OperatorFactory()).post(f"/api/v1/jobs/{job.id}/cancel")
    assert allowed.status_code == 200 and allowed.json()["status"] == "cancelled"
    own = make_job(owner=(owner := UserFactory()))
    assert client_for(owner).post(f"/api/v1/jobs/{own.id}/cancel").status_code == 200


def test_an_operator_token_without_a_second_factor_is_its_plain_user_on_the_public_api():
    """Issue 25's reproduction: staff `olga` in `operator`, no TOTP device, a token; another
    user's job. Without an OTP grant her token sees and cancels only her own jobs."""
    olga = role_user("operator", username="olga")
    job = make_job(owner=UserFactory(), job_type="sim")
    artefact = artefact_save(job_id=job.id, kind="report", name="r.csv", data=b"x")
    token_only = client_for(olga)
    for call in (
        token_only.post(f"/api/v1/jobs/{job.id}/cancel"),
        token_only.get(f"/api/v1/jobs/{job.id}"),
        token_only.get(f"/api/v1/jobs/{job.id}", HTTP_IF_NONE_MATCH=f'"{job.id}-1"'),
        token_only.get(f"/api/v1/jobs/{job.id}/artefacts/{artefact.id}"),
    ):
        assert call.status_code == 404 and call.json()["error"]["code"] == "ERR-JOB-404"
    assert token_only.get("/api/v1/jobs").json()["results"] == []
    refused = token_only.post(
        "/api/v1/jobs", {"type": "report", "params": {"all_owners": True}}, format="json"
    )
    assert refused.status_code == 422 and "all_owners" in refused.json()["error"]["details"]
    stored = Job.objects.get(id=job.id)
    assert stored.status == Status.PENDING and stored.cancel_requested is False
    # Her own jobs stay hers, grant or not.
    own = make_job(owner=olga)
    assert token_only.get(f"/api/v1/jobs/{own.id}").status_code == 200


def test_the_same_operator_with_a_live_grant_has_staff_powers():
    olga = role_user("operator", username="olga")
    job = make_job(owner=UserFactory(), job_type="sim")
    granted = client_with_grant(olga)
    assert granted.get(f"/api/v1/jobs/{job.id}").status_code == 200
    assert [j["id"] for j in granted.get("/api/v1/jobs").json()["results"]] == [str(job.id)]
    cancelled = granted.post(f"/api/v1/jobs/{job.id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    wide = granted.post(
        "/api/v1/jobs", {"type": "report", "params": {"all_owners": True}}, format="json"
    )
    assert wide.status_code == 201, wide.content


def test_a_grant_ends_the_staff_powers_when_it_expires_or_its_token_changes():
    olga = role_user("operator", username="olga")
    job = make_job(owner=UserFactory(), job_type="sim")
    granted = client_with_grant(olga)
    assert granted.get(f"/api/v1/jobs/{job.id}").status_code == 200
    Token.objects.filter(user=olga).delete()  # rotated: the new token holds no grant
    assert client_for(olga).get(f"/api/v1/jobs/{job.id}").status_code == 404


def test_a_staff_session_that_passed_otp_has_staff_powers_and_one_that_did_not_has_none():
    job = make_job(owner=UserFactory(), job_type="sim")
    verified = otp_login(APIClient(), role_user("operator"))
    assert verified.get(f"/api/v1/jobs/{job.id}").status_code == 200
    password_only = APIClient()
    password_only.force_login(role_user("operator"))
    assert password_only.get(f"/api/v1/jobs/{job.id}").status_code == 404


def test_verified_staff_without_a_role_that_reads_jobs_is_its_plain_user():
    job = make_job(owner=UserFactory(), job_type="sim")
    no_role = client_with_grant(StaffFactory())
    assert no_role.get(f"/api/v1/jobs/{job.id}").status_code == 404
    assert no_role.post(f"/api/v1/jobs/{job.id}/cancel").status_code == 404
    assert no_role.get("/api/v1/jobs").json()["results"] == []
    assert Job.objects.get(id=job.id).cancel_requested is False
