"""The job page for a person (docs/operations/portal.md#a-jobs-page): who did what, by
name; where the job belongs; what a re-run said; attempts that agree with the status; and
times with seconds and their zone everywhere in the portal."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from audit.models import ActorType
from audit.services import Actor
from jobs.models import Job
from jobs.selectors import job_attempts, job_timeline
from jobs.services import job_cancel, job_create, job_rerun
from jobs.services.transitions import job_audit
from jobs.services.worker import job_claim
from tenants.models import Membership, Role
from tenants.services import service_account_create
from tests.factories import (
    OperatorFactory,
    OrganisationFactory,
    ProjectFactory,
    UserFactory,
    client_for,
    job_in_state,
    make_job,
    role_user,
)

pytestmark = pytest.mark.django_db

# A time as the portal shows it: the date, the time to the second, and its zone.
WHEN = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")


def page(client, job: Job) -> str:
    response = client.get(reverse("admin:jobs_job_change", args=[job.id]))
    assert response.status_code == 200
    return response.content.decode()


def actors(job: Job) -> list[str]:
    return [entry["actor"] for entry in job_timeline(job=Job.objects.get(id=job.id))]


# --- L1: actors by name ------------------------------------------------------------------


def test_the_timeline_names_users_service_accounts_and_operators_by_name(otp_admin_client):
    org = OrganisationFactory(slug="acme")
    account = service_account_create(org=org, name="nightly-export")
    job, _ = job_create(
        owner=account.user,
        job_type="sim",
        params={"steps": 1},
        actor=Actor(ActorType.SERVICE, str(account.user.pk)),
    )
    olga = OperatorFactory(username="olga", first_name="Olga", last_name="Berg")
    job_cancel(job_id=job.id, actor=Actor.operator(olga))
    created, *cancel = actors(job)
    assert created == "service account nightly-export"
    assert cancel and set(cancel) == {"operator olga (Olga Berg)"}
    text = page(otp_admin_client, job)
    assert "service account nightly-export" in text and "operator olga (Olga Berg)" in text
    assert "service: " not in text and "operator: " not in text


def test_a_person_is_named_by_username_and_one_gone_by_id(otp_admin_client):
    alice = UserFactory(username="alice")
    job = make_job(owner=alice)
    gone = OperatorFactory(username="gone")
    gone_id = gone.pk
    job_audit(job_id=job.id, event_type="note", actor=Actor.operator(gone))
    job_audit(job_id=job.id, event_type="note", actor=Actor.system("dispatcher"))
    gone.delete()
    assert actors(job) == ["alice", f"operator #{gone_id} (deleted)", "system: dispatcher"]
    assert f"operator #{gone_id} (deleted)" in page(otp_admin_client, job)


def test_naming_the_actors_is_one_query_whatever_their_number():
    job = make_job()

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            job_timeline(job=Job.objects.get(id=job.id))
        return len(captured)

    before = queries()
    for _ in range(5):
        job_audit(job_id=job.id, event_type="note", actor=Actor.operator(OperatorFactory()))
        job_audit(job_id=job.id, event_type="note", actor=Actor.user(UserFactory()))
    assert queries() == before


# --- L2: where the job belongs ---------------------------------------------------------------


def test_the_job_page_shows_organisation_project_and_correlation_id(otp_admin_client):
    org = OrganisationFactory(slug="globex", name="Globex Corporation")
    project = ProjectFactory(organisation=org, slug="billing", name="Billing")
    owner = UserFactory(org=org)
    response = client_for(owner).post(
        "/api/v1/jobs",
        {"type": "sim", "params": {"steps": 1}, "org": "globex", "project": "billing"},
        format="json",
        HTTP_X_CORRELATION_ID="order-4711",
    )
    assert response.status_code == 201, response.content
    job = Job.objects.get(id=response.json()["id"])
    assert (job.project_id, job.correlation_id) == (project.id, "order-4711")
    text = page(otp_admin_client, job)
    facts = text[text.index('id="facts"') :]
    assert re.search(r"<dt>Organisation</dt><dd[^>]*>.*globex", facts)
    assert re.search(r"<dt>Project</dt><dd[^>]*>.*billing", facts)
    assert re.search(r"<dt>Correlation id</dt><dd[^>]*><code>order-4711</code>", facts)


# --- L3: a re-run's justification and the new job ---------------------------------------------


def test_a_reruns_entry_shows_its_justification_and_links_both_jobs(otp_admin_client):
    original = job_in_state("failed")
    olga = OperatorFactory(username="olga")
    new = job_rerun(job_id=original.id, actor_user=olga, justification="INC-77: upstream fixed")
    new_url = reverse("admin:jobs_job_change", args=[new.id])
    text = page(otp_admin_client, original)
    timeline = text[text.index('id="timeline"') :]
    rerun = timeline[timeline.index('class="ev-rerun"') :]
    rerun = rerun[: rerun.index("</li>")]
    assert "“INC-77: upstream fixed”" in rerun
    assert f'href="{new_url}"' in rerun and "operator olga" in rerun
    created = page(otp_admin_client, new)
    created = created[created.index('class="ev-created"') :]
    created = created[: created.index("</li>")]
    assert f'href="{reverse("admin:jobs_job_change", args=[original.id])}"' in created


# --- L4: the attempts agree with the status ------------------------------------------------


def test_attempts_read_with_the_jobs_row_show_no_claim_made_after_it():
    job = job_in_state("queued")
    seen = Job.objects.get(id=job.id)  # the page reads the row: queued, never started
    assert job_claim(job_id=job.id, locked_by="w1") is not None  # a worker claims it now
    assert job_attempts(job=seen).rows == []
    assert "started" not in [e["event"] for e in job_timeline(job=seen)]
    running = Job.objects.get(id=job.id)
    [attempt] = job_attempts(job=running).rows
    assert (attempt.number, attempt.outcome) == (1, "running")


def test_the_page_of_a_job_claimed_while_it_renders_agrees_with_itself(
    otp_admin_client, monkeypatch
):
    """A re-run's page opens as a worker claims the new job: the header read it pending,
    so the attempts (read after the claim) must not say running."""
    from jobs.admin import job_pages

    original = job_in_state("cancelled")
    new = job_rerun(job_id=original.id, actor_user=OperatorFactory(), justification="again")
    real = job_pages.job_timeline

    def claimed_meanwhile(**kwargs):
        assert job_claim(job_id=new.id, locked_by="w1") is not None
        return real(**kwargs)

    monkeypatch.setattr(job_pages, "job_timeline", claimed_meanwhile)
    text = page(otp_admin_client, new)
    assert 'class="badge badge-pending big"' in text and "not started yet" in text
    assert 'id="attempts-empty"' in text
    assert "badge-running" not in text
    assert Job.objects.get(id=new.id).status == "running"


def test_the_live_part_of_the_page_carries_the_attempts_with_the_status(otp_admin_client):
    job = job_in_state("running")
    response = otp_admin_client.get(reverse("admin:jobs_job_live", args=[job.id]))
    text = response.content.decode()
    assert 'class="badge badge-running big"' in text and "attempt 1 of" in text
    attempts = text[text.index('id="attempts"') :]
    assert 'class="badge badge-running">running</span>' in attempts


# --- L6: seconds and UTC ---------------------------------------------------------------------


def test_the_audit_log_list_shows_times_to_the_second_in_utc(otp_admin_client):
    make_job()
    text = otp_admin_client.get("/admin/audit/auditlog/").content.decode()
    rows = text[text.index('id="result_list"') :]
    assert WHEN.search(rows), rows[:2000]
    assert " a.m." not in rows and " p.m." not in rows


def test_the_job_list_shows_run_at_to_the_second_in_a_utc_column(otp_admin_client):
    job = job_in_state("scheduled")
    text = otp_admin_client.get("/admin/jobs/job/").content.decode()
    assert "Run at (UTC)" in text and "Created (UTC)" in text  # the column says its zone
    cell = re.search(r'<td class="field-run_at_utc">(.*?)</td>', text).group(1)
    assert re.sub(r"<[^>]+>", "", cell) == job.run_at.strftime("%Y-%m-%d %H:%M:%S")


def test_the_job_page_shows_every_time_with_seconds_and_utc(otp_admin_client):
    job = job_in_state("failed")
    text = page(otp_admin_client, job)
    timeline = text[text.index('id="timeline"') :]
    assert len(WHEN.findall(timeline)) == len(job_timeline(job=Job.objects.get(id=job.id)))
    letters = text[text.index('id="dead-letters"') : text.index('id="result"')]
    assert WHEN.search(letters)


# --- L11: an organisation's admin is audited as themselves -------------------------------------


def test_a_non_staff_org_admin_cancelling_a_members_job_is_audited_as_a_user():
    org = OrganisationFactory()
    member = UserFactory(org=org)
    admin = UserFactory(org=org)
    Membership.objects.filter(user=admin).update(role=Role.ADMIN)
    job = make_job(owner=member)
    job.refresh_from_db()
    assert not admin.is_staff
    response = client_for(admin).post(f"/api/v1/jobs/{job.id}/cancel")
    assert response.status_code in (200, 202), response.content
    entry = job_timeline(job=Job.objects.get(id=job.id))[-1]
    assert entry["event"] == "cancelled"
    assert entry["actor"] == admin.username  # a person acting, not staff


def test_staff_with_staff_powers_cancelling_anothers_job_stay_an_operator(otp_admin_client):
    from tests.factories import client_with_grant

    job = make_job()
    olga = role_user("operator", username="olga")
    response = client_with_grant(olga).post(f"/api/v1/jobs/{job.id}/cancel")
    assert response.status_code in (200, 202), response.content
    assert job_timeline(job=Job.objects.get(id=job.id))[-1]["actor"] == "operator olga"
