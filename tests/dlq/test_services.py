from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from audit.models import AuditLog
from audit.services import Actor
from jobs.domain.exceptions import JobLost
from jobs.domain.states import Status
from jobs.models import DeadLetter, Job
from jobs.services import Fence, job_fail_with_dead_letter
from tests.factories import job_in_state, make_job

pytestmark = pytest.mark.django_db
SYSTEM = Actor.system()


def test_fail_with_dead_letter_commits_failed_and_an_open_row():
    job = job_in_state("running", worker="w1")
    failed, row = job_fail_with_dead_letter(
        job_id=job.id,
        reason="fatal",
        error_code="FATAL",
        error_message="boom",
        actor=SYSTEM,
        fence=Fence("w1", 1),
    )
    assert failed.status == Status.FAILED and failed.dead_letter_queue == "sim_dlq"
    assert failed.locked_by is None and failed.last_error_code == "FATAL"
    assert (row.queue, row.reason, row.state) == ("sim_dlq", "fatal", "open")
    entry = AuditLog.objects.filter(job_id=job.id).latest("seq")
    assert entry.event_type == "failed" and '"reason":"fatal"' in entry.payload


def test_fail_with_dead_letter_by_a_reclaimed_worker_writes_nothing():
    job = job_in_state("running", worker="w1")
    Job.objects.filter(id=job.id).update(locked_by="w2", attempts=2)
    with pytest.raises(JobLost):
        job_fail_with_dead_letter(job_id=job.id, reason="fatal", actor=SYSTEM, fence=Fence("w1", 1))
    assert DeadLetter.objects.count() == 0
    assert Job.objects.get(id=job.id).status == Status.RUNNING


def test_only_one_open_dead_letter_per_job():
    job = make_job()
    DeadLetter.objects.create(job=job, queue="sim_dlq", reason="fatal")
    with pytest.raises(IntegrityError), transaction.atomic():
        DeadLetter.objects.create(job=job, queue="sim_dlq", reason="fatal")
