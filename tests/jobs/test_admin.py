from __future__ import annotations

import pytest

from audit.models import AuditLog
from jobs.models import Job
from jobs.states import Status
from tests.factories import StaffFactory, make_job

pytestmark = pytest.mark.django_db


def test_admin_without_otp_verification_sends_staff_to_login(client):
    client.force_login(StaffFactory(is_superuser=True))
    response = client.get("/admin/jobs/job/")
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_job_detail_shows_its_audit_trail_and_cannot_be_edited(otp_admin_client):
    job = make_job()
    response = otp_admin_client.get(f"/admin/jobs/job/{job.id}/change/")
    assert response.status_code == 200
    assert b"#1" in response.content and b"created" in response.content
    posted = otp_admin_client.post(f"/admin/jobs/job/{job.id}/change/", {"status": "succeeded"})
    assert posted.status_code == 403
    assert Job.objects.get(id=job.id).status == Status.PENDING


def test_cancel_action_asks_first_then_cancels_through_the_service(otp_admin_client):
    job = make_job()
    chosen = {"action": "cancel_jobs", "_selected_action": [str(job.id)]}
    asked = otp_admin_client.post("/admin/jobs/job/", chosen)
    assert asked.status_code == 200 and b"Yes, cancel 1 job" in asked.content
    assert Job.objects.get(id=job.id).status == Status.PENDING
    response = otp_admin_client.post("/admin/jobs/job/", {**chosen, "confirm": "yes"})
    assert response.status_code == 302
    assert Job.objects.get(id=job.id).status == Status.CANCELLED
    actor_ids = set(AuditLog.objects.filter(job_id=job.id).values_list("actor_id", flat=True))
    assert str(otp_admin_client.user.pk) in actor_ids


def test_audit_log_admin_refuses_changes(otp_admin_client):
    job = make_job()
    entry = AuditLog.objects.get(job_id=job.id)
    assert otp_admin_client.get(f"/admin/audit/auditlog/{entry.pk}/change/").status_code == 200
    assert otp_admin_client.get("/admin/audit/auditlog/add/").status_code == 403
    assert (
        otp_admin_client.post(
            f"/admin/audit/auditlog/{entry.pk}/delete/", {"post": "yes"}
        ).status_code
        == 403
    )
    assert AuditLog.objects.filter(pk=entry.pk).exists()
