"""The admin's chain verification page and action (read-only, staff behind OTP)."""

from __future__ import annotations

import pytest

from audit.checkpoints import checkpoint_write
from audit.models import AuditLog
from audit.services import job_chain
from tests.audit.tampering import tamper
from tests.factories import UserFactory, job_in_state

pytestmark = pytest.mark.django_db
VERIFY_URL = "/admin/audit/auditlog/verify/"


def test_verify_page_reports_an_intact_trail(otp_admin_client):
    job_in_state("succeeded")
    checkpoint_write()
    page = otp_admin_client.get(VERIFY_URL)
    assert page.status_code == 200 and b"verify-result" not in page.content  # form only
    result = otp_admin_client.get(VERIFY_URL, {"run": "1"})
    assert result.status_code == 200
    assert result.context["report"].ok
    assert b"Intact." in result.content


def test_verify_page_names_job_and_seq_of_a_tamper_and_can_check_one_job(otp_admin_client):
    job, other = job_in_state("succeeded"), job_in_state("succeeded")
    tamper("DELETE FROM audit_logs WHERE chain = %s AND seq = 2", [job_chain(job.id)])
    result = otp_admin_client.get(VERIFY_URL, {"run": "1"})
    assert b"TAMPERED: 1 problem." in result.content
    [problem] = result.context["report"].problems
    assert (problem.job_id, problem.seq) == (str(job.id), 3)
    assert str(job.id).encode() in result.content

    one = otp_admin_client.get(VERIFY_URL, {"run": "1", "job": str(other.id)})
    assert one.context["report"].ok and one.context["report"].rows_checked == 4
    bad = otp_admin_client.get(VERIFY_URL, {"run": "1", "job": "nope"})
    assert bad.context["report"] is None and b"is not a job id" in bad.content


def test_verify_page_is_for_otp_verified_staff_only(client):
    assert client.get(VERIFY_URL).status_code == 302  # to the login page
    client.force_login(UserFactory(is_staff=True))  # password only, no OTP
    assert client.get(VERIFY_URL).status_code == 302


def test_changelist_links_to_the_verify_page(otp_admin_client):
    job_in_state("succeeded")
    page = otp_admin_client.get("/admin/audit/auditlog/")
    assert page.status_code == 200
    assert VERIFY_URL.encode() in page.content


def test_action_verifies_the_chains_of_the_selected_rows(otp_admin_client):
    job, other = job_in_state("succeeded"), job_in_state("succeeded")
    tamper("UPDATE audit_logs SET chain_hash = repeat('a', 64) WHERE chain = %s AND seq = 4",
           [job_chain(job.id)])  # fmt: skip
    selected = AuditLog.objects.filter(job_id=other.id, seq__in=[1, 2])
    response = otp_admin_client.post(
        "/admin/audit/auditlog/",
        {"action": "verify_selected_chains", "_selected_action": [e.pk for e in selected]},
    )
    assert response.status_code == 200
    assert response.context["report"].ok and response.context["report"].rows_checked == 4
    assert response.context["chains"] == [job_chain(other.id)]

    tampered = AuditLog.objects.filter(job_id=job.id, seq=1)
    response = otp_admin_client.post(
        "/admin/audit/auditlog/",
        {"action": "verify_selected_chains", "_selected_action": [e.pk for e in tampered]},
    )
    [problem] = response.context["report"].problems
    assert (problem.job_id, problem.seq) == (str(job.id), 4)


def test_audit_admin_stays_read_only(otp_admin_client):
    job_in_state("succeeded")
    checkpoint = checkpoint_write()
    entry = AuditLog.objects.first()
    for url in ("/admin/audit/auditlog/add/", "/admin/audit/auditcheckpoint/add/"):
        assert otp_admin_client.get(url).status_code == 403
    assert otp_admin_client.post(f"/admin/audit/auditlog/{entry.pk}/delete/").status_code == 403
    deleted = otp_admin_client.post(f"/admin/audit/auditcheckpoint/{checkpoint.pk}/delete/")
    assert deleted.status_code == 403
    changelist = otp_admin_client.get("/admin/audit/auditlog/")
    actions = [name for name, _ in changelist.context["action_form"].fields["action"].choices]
    assert "delete_selected" not in actions and "verify_selected_chains" in actions
    assert AuditLog.objects.count() == 4


def test_the_log_list_filters_the_ops_chain_or_the_jobs_chains(otp_admin_client):
    from audit.services import Actor
    from jobs.services.queues import queue_pause

    job = job_in_state("succeeded")
    queue_pause(queue="sim", reason="INC-1", actor=Actor.system("test"))
    listing = otp_admin_client.get("/admin/audit/auditlog/")
    assert b"operations (ops)" in listing.content  # offered in the filter panel
    ops = otp_admin_client.get("/admin/audit/auditlog/", {"chain": "ops"})
    assert {e.chain for e in ops.context["cl"].result_list} == {"ops"}
    assert [e.event_type for e in ops.context["cl"].result_list] == ["queue_paused"]
    jobs = otp_admin_client.get("/admin/audit/auditlog/", {"chain": "jobs"})
    assert {e.chain for e in jobs.context["cl"].result_list} == {job_chain(job.id)}
