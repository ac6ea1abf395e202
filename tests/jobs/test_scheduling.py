"""Scheduled jobs (docs/operator-controls.md#scheduled-jobs): run_at on create, the
`scheduled` status, the dispatcher's step that moves due jobs to `pending`, cancel."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditLog
from audit.services import Actor
from audit.verification import audit_verify
from jobs.domain.exceptions import JobRunAtInvalidError
from jobs.models import Job
from jobs.processes.dispatcher import wake_in
from jobs.services import job_cancel
from jobs.services.creation import job_create
from jobs.services.scheduling import MAX_WAKE_SECONDS, promote_due_jobs, promote_due_once
from tests.factories import UserFactory
from tests.processes import job_events

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/jobs"
SIM = {"type": "sim", "params": {"steps": 1, "step_seconds": 0}}


def iso(moment):
    return moment.isoformat()


def scheduled_job(owner=None, *, ahead=timedelta(minutes=5), key=None):
    job, _ = job_create(
        owner=owner or UserFactory(),
        job_type="sim",
        params={"steps": 1, "step_seconds": 0},
        idempotency_key=key,
        run_at=timezone.now() + ahead,
    )
    return job


def test_a_future_run_at_creates_the_job_scheduled_with_its_run_at_in_the_body(api):
    run_at = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    response = api.post(JOBS, {**SIM, "run_at": iso(run_at)}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["status"] == "scheduled"
    assert body["run_at"] is not None
    job = Job.objects.get(id=body["id"])
    assert job.status == "scheduled" and job.run_at == run_at
    created = AuditLog.objects.get(job_id=job.id, seq=1)
    assert created.event_type == "created" and '"to":"scheduled"' in created.payload
    assert audit_verify(job_ids=[job.id]).ok


def test_a_job_without_run_at_is_pending_with_a_null_run_at(api):
    body = api.post(JOBS, SIM, format="json").json()
    assert body["status"] == "pending" and body["run_at"] is None


@pytest.mark.parametrize(
    "value",
    ["2026-12-01T09:00:00", "2026-12-01 09:00", "tomorrow", "2026-13-01T09:00:00Z", 12, ""],
)
def test_a_run_at_without_an_offset_or_not_a_date_is_a_400_on_the_field(api, value):
    response = api.post(JOBS, {**SIM, "run_at": value}, format="json")
    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert "offset" in error["details"]["run_at"][0]
    assert not Job.objects.exists()


def test_a_run_at_beyond_the_schedule_horizon_is_a_422(api, settings):
    settings.JOBOPS_MAX_SCHEDULE_AHEAD = 10
    late = timezone.now() + timedelta(days=10, minutes=1)
    response = api.post(JOBS, {**SIM, "run_at": iso(late)}, format="json")
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "ERR-JOB-422"
    assert "run_at" in response.json()["error"]["details"]
    fine = api.post(JOBS, {**SIM, "run_at": iso(late - timedelta(minutes=2))}, format="json")
    assert fine.status_code == 201 and fine.json()["status"] == "scheduled"


def test_a_run_at_up_to_a_minute_past_runs_now_and_further_past_is_a_422(api):
    recent = timezone.now() - timedelta(seconds=30)
    response = api.post(JOBS, {**SIM, "run_at": iso(recent)}, format="json")
    assert response.status_code == 201 and response.json()["status"] == "pending"
    old = timezone.now() - timedelta(seconds=90)
    response = api.post(JOBS, {**SIM, "run_at": iso(old)}, format="json")
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "ERR-JOB-422"
    assert Job.objects.count() == 1


def test_a_naive_run_at_is_refused_by_the_service_too():
    with pytest.raises(JobRunAtInvalidError):
        job_create(
            owner=UserFactory(),
            job_type="sim",
            params={},
            run_at=timezone.now().replace(tzinfo=None),
        )


def test_the_key_of_a_scheduled_job_outlives_its_run_at():
    job = scheduled_job(ahead=timedelta(days=30), key="later")
    assert job.idempotency_expires_at > job.run_at
    now_job, _ = job_create(owner=UserFactory(), job_type="sim", params={}, idempotency_key="now")
    ttl = now_job.idempotency_expires_at - now_job.created_at
    assert abs((job.idempotency_expires_at - job.run_at) - ttl) < timedelta(seconds=5)


def test_the_step_moves_due_scheduled_jobs_to_pending_audited_due_and_leaves_the_rest():
    due = scheduled_job(ahead=timedelta(seconds=30))
    later = scheduled_job(ahead=timedelta(hours=1))
    assert promote_due_jobs(now=timezone.now()) == 0
    assert promote_due_jobs(now=timezone.now() + timedelta(seconds=31)) == 1
    due.refresh_from_db()
    later.refresh_from_db()
    assert due.status == "pending" and later.status == "scheduled"
    assert job_events(due.id) == ["created", "due"]
    assert audit_verify(job_ids=[due.id, later.id]).ok


def test_the_step_says_when_to_look_again_no_later_than_the_next_run_at():
    assert promote_due_once()["wake_in"] == MAX_WAKE_SECONDS
    scheduled_job(ahead=timedelta(milliseconds=400))
    result = promote_due_once()
    assert result["promoted"] == 0 and 0.02 <= result["wake_in"] <= 0.4
    assert wake_in(result, default=5.0) == result["wake_in"]
    assert wake_in({"published": 3}, default=5.0) == 5.0


def test_a_scheduled_job_can_be_cancelled_and_is_then_never_promoted(user):
    job = scheduled_job(user, ahead=timedelta(seconds=1))
    cancelled = job_cancel(job_id=job.id, actor=Actor.user(user))
    assert cancelled.status == "cancelled"
    assert promote_due_jobs(now=timezone.now() + timedelta(minutes=1)) == 0
    assert Job.objects.get(id=job.id).status == "cancelled"
    assert job_events(job.id) == ["created", "cancel_requested", "cancelled"]
    assert audit_verify(job_ids=[job.id]).ok


def test_the_owner_cancels_a_scheduled_job_through_the_api(api, user):
    job = scheduled_job(user)
    response = api.post(f"{JOBS}/{job.id}/cancel")
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == "cancelled"


def test_a_repeat_of_a_scheduled_jobs_key_returns_the_scheduled_job(api):
    run_at = (timezone.now() + timedelta(hours=1)).replace(microsecond=0)
    body = {**SIM, "run_at": iso(run_at), "idempotency_key": "nightly-report"}
    first = api.post(JOBS, body, format="json")
    assert first.status_code == 201, first.json()
    # The retried request, even with another run_at: the job the key made, still waiting.
    again = api.post(JOBS, {**body, "run_at": iso(run_at + timedelta(minutes=5))}, format="json")
    assert again.status_code == 200, again.json()
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["status"] == "scheduled"
    assert again.json()["run_at"] == first.json()["run_at"]
    assert Job.objects.count() == 1
    job = Job.objects.get()
    assert job.run_at == run_at and job_events(job.id) == ["created"]


def test_a_paused_queues_scheduled_job_comes_due_but_waits_unpublished_until_resume(broker):
    from jobs.services import publish_due_once
    from jobs.services.queues import queue_pause, queue_resume

    job = scheduled_job(ahead=timedelta(seconds=30))
    operator = Actor.system("test-operator")
    queue_pause(queue=job.queue, reason="incident", actor=operator)
    assert promote_due_jobs(now=timezone.now() + timedelta(seconds=31)) == 1
    job.refresh_from_db()
    assert job.status == "pending"
    assert publish_due_once() == 0
    job.refresh_from_db()
    assert job.status == "pending"
    queue_resume(queue=job.queue, reason="over", actor=operator)
    assert publish_due_once() == 1
    job.refresh_from_db()
    assert job.status == "queued"
    assert job_events(job.id) == ["created", "due", "queued"]
    assert audit_verify(job_ids=[job.id]).ok
