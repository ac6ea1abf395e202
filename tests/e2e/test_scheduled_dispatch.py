"""A scheduled job starts on time with a real dispatcher and worker, also when the
dispatcher restarts while it waits (docs/operator-controls.md#scheduled-jobs)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditLog
from audit.verification import audit_verify
from jobs.models import Job
from jobs.services.creation import job_create
from tests.factories import UserFactory
from tests.processes import celery_worker, dispatcher_process, job_events, job_finished
from tests.queues import topology_declare_and_purge

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("broker")]


def test_a_job_due_in_a_few_seconds_starts_within_two_seconds_across_a_restart():
    topology_declare_and_purge()
    with celery_worker(queues=["sim"], name="sched-worker"):
        job, _ = job_create(
            owner=UserFactory(),
            job_type="sim",
            params={"steps": 1, "step_seconds": 0},
            run_at=timezone.now() + timedelta(seconds=10),
        )
        assert job.status == "scheduled"
        # A long interval: only the step's wake-up (the next run_at) can start it on time.
        with dispatcher_process(interval=30, name="sched-d1") as first:
            # Its first pass, after the job was made, looked at it (a step's run counts
            # once it has ended) and left it for later: no early start.
            first.wait_for_runs("scheduled", 1)
            assert timezone.now() < job.run_at, "too slow to see the job before it was due"
            assert Job.objects.get(id=job.id).status == "scheduled"
            assert job_events(job.id) == ["created"]
        assert Job.objects.get(id=job.id).status == "scheduled"
        with dispatcher_process(interval=30, name="sched-d2"):
            done = job_finished(job.id, timeout=40)
    assert done.status == "succeeded"
    started = AuditLog.objects.get(job_id=job.id, event_type="started").ts
    due = AuditLog.objects.get(job_id=job.id, event_type="due").ts
    assert due >= job.run_at
    print(f"run_at -> due {due - job.run_at}, -> started {started - job.run_at}")
    assert started - job.run_at < timedelta(seconds=2), started - job.run_at
    assert audit_verify(job_ids=[job.id]).ok
