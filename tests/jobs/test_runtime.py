"""JobContext and the worker write paths, in process (no subprocess needed)."""

from __future__ import annotations

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.db import IntegrityError

from audit.models import AuditLog
from audit.services import Actor
from dlq.services import dead_letters_replay
from jobs.errors import FatalError, JobCancelled, JobValidationError, TransientExternalError
from jobs.exceptions import JobLost
from jobs.models import Job
from jobs.runtime import JobContext, classify
from jobs.selectors import job_time_limit_retries
from jobs.services import (
    WORKER,
    Fence,
    backoff_delay,
    job_cancel,
    job_claim,
    job_fail_with_dead_letter,
    job_reclaim,
    job_retry,
    job_succeed,
)
from tests.factories import OperatorFactory, backdate, job_in_state

pytestmark = pytest.mark.django_db


def claimed():
    job = job_in_state("running", worker="w1")
    assert job.status == "running" and job.attempts == 1
    return job, Fence("w1", 1)


def progress_events(job_id):
    return AuditLog.objects.filter(job_id=job_id, event_type="progress").count()


def test_progress_is_monotonic_coalesced_and_flushed_on_the_final_transition(settings):
    settings.JOBOPS_PROGRESS_INTERVAL_SECONDS = 3600
    job, fence = claimed()
    ctx = JobContext(job=job, fence=fence, log=None)
    ctx.progress(10, step="a")  # the first value is written at once
    row = Job.objects.get(id=job.id)
    assert (row.progress_percent, row.progress_step) == (10, "a")
    assert row.version > job.version  # the API's ETag moves with progress
    ctx.progress(5, step="b")  # never goes back
    ctx.progress(40, step="c")  # coalesced: not written yet
    assert Job.objects.get(id=job.id).progress_percent == 10
    assert progress_events(job.id) == 1
    pending = ctx.take_pending_progress()
    assert pending == {"percent": 40, "step": "c", "message": None}
    done = job_succeed(job_id=job.id, fence=fence, result={"ok": 1}, progress=pending)
    assert (done.progress_percent, done.progress_step, done.result) == (100, "c", {"ok": 1})


def test_progress_writes_again_once_the_interval_has_passed(settings):
    settings.JOBOPS_PROGRESS_INTERVAL_SECONDS = 0
    job, fence = claimed()
    ctx = JobContext(job=job, fence=fence, log=None)
    for percent in (10, 20, 30):
        ctx.progress(percent)
    assert Job.objects.get(id=job.id).progress_percent == 30
    assert progress_events(job.id) == 3


def test_check_cancel_raises_once_cancellation_is_requested(settings):
    settings.JOBOPS_CANCEL_CHECK_SECONDS = 0
    job, fence = claimed()
    ctx = JobContext(job=job, fence=fence, log=None)
    ctx.check_cancel()  # nothing requested
    job_cancel(job_id=job.id, actor=Actor.system("test"))
    assert Job.objects.get(id=job.id).status == "running"  # running: the handler decides
    with pytest.raises(JobCancelled):
        ctx.check_cancel()


def test_a_reclaimed_worker_has_every_later_write_refused(settings):
    settings.JOBOPS_PROGRESS_INTERVAL_SECONDS = 0
    job, fence = claimed()
    ctx = JobContext(job=job, fence=fence, log=None)
    backdate(job, locked_at=60)  # the worker stopped heartbeating a minute ago
    assert job_reclaim(job_id=job.id, lock_timeout=30).status == "retrying"
    before = Job.objects.get(id=job.id)
    trail = AuditLog.objects.filter(job_id=job.id).count()
    with pytest.raises(JobLost):
        ctx.progress(50)
    with pytest.raises(JobLost):
        ctx.save_artefact("out", "x.txt", b"late")
    with pytest.raises(JobLost):
        job_succeed(job_id=job.id, fence=fence, result={})
    after = Job.objects.get(id=job.id)
    assert (after.status, after.version, after.progress_percent) == ("retrying", before.version, 0)
    assert AuditLog.objects.filter(job_id=job.id).count() == trail
    assert not after.artefacts.exists()


def test_reclaim_leaves_a_live_lock_alone():
    job, _ = claimed()
    assert job_reclaim(job_id=job.id, lock_timeout=30) is None
    assert Job.objects.get(id=job.id).status == "running"


def test_claim_refuses_a_running_job_and_a_retry_not_yet_due():
    job, _ = claimed()
    assert job_claim(job_id=job.id, locked_by="w2") is None
    backdate(job, locked_at=60)
    job_reclaim(job_id=job.id, lock_timeout=30)
    backdate(job, next_run_at=-3600)  # due in an hour
    assert job_claim(job_id=job.id, locked_by="w2") is None
    backdate(job, next_run_at=0)  # due now
    again = job_claim(job_id=job.id, locked_by="w2")
    assert again is not None and again.attempts == 2 and again.locked_by == "w2"


def test_claim_of_a_retry_starts_progress_from_zero(settings):
    settings.JOBOPS_PROGRESS_INTERVAL_SECONDS = 0
    job, fence = claimed()
    ctx = JobContext(job=job, fence=fence, log=None)
    ctx.progress(99, step="9900/10000", message="x=1.0")
    job_retry(job_id=job.id, fence=fence, delay=0, error_code="TIME_LIMIT", error_message="late")
    assert Job.objects.get(id=job.id).progress_percent == 99  # the failed attempt's, until...
    again = job_claim(job_id=job.id, locked_by="w2")
    assert again is not None and again.attempts == 2
    stored = Job.objects.get(id=job.id)
    assert (stored.progress_percent, stored.progress_step, stored.progress_message) == (
        0,
        None,
        None,
    )
    assert stored.progress_updated_at is None
    # Within the new attempt progress is monotonic again, from zero.
    ctx2 = JobContext(job=again, fence=Fence("w2", 2), log=None)
    ctx2.progress(2, step="200/10000")
    ctx2.progress(1, step="100/10000")
    assert Job.objects.get(id=job.id).progress_percent == 2


def test_claim_after_a_reclaim_starts_progress_from_zero(settings):
    settings.JOBOPS_PROGRESS_INTERVAL_SECONDS = 0
    job, fence = claimed()
    JobContext(job=job, fence=fence, log=None).progress(60, step="lost here")
    backdate(job, locked_at=60)  # the worker was killed
    assert job_reclaim(job_id=job.id, lock_timeout=30).progress_percent == 60
    again = job_claim(job_id=job.id, locked_by="w2")
    assert (again.progress_percent, again.progress_step, again.attempts) == (0, None, 2)
    # A late write of the lost attempt cannot bring its percent back (fenced).
    with pytest.raises(JobLost):
        JobContext(job=job, fence=fence, log=None).progress(80)
    assert Job.objects.get(id=job.id).progress_percent == 0


def _retry_with(job_id, error_code, worker):
    claimed = job_claim(job_id=job_id, locked_by=worker)
    assert claimed is not None
    fence = Fence(worker, claimed.attempts)
    job_retry(job_id=job_id, fence=fence, delay=0, error_code=error_code, error_message="x")
    return fence


def test_time_limit_retries_count_only_the_jobs_time_limit_retries():
    job = job_in_state("queued")
    assert job_time_limit_retries(job_id=job.id) == 0
    _retry_with(job.id, "TIME_LIMIT", "w1")
    assert job_time_limit_retries(job_id=job.id) == 1
    _retry_with(job.id, "TRANSIENT_EXTERNAL", "w2")
    assert job_time_limit_retries(job_id=job.id) == 1
    _retry_with(job.id, "TIME_LIMIT", "w3")
    assert job_time_limit_retries(job_id=job.id) == 2
    assert job_time_limit_retries(job_id=job_in_state("retrying").id) == 0  # another job


def test_a_replay_gives_the_job_a_fresh_time_limit_retry(broker):
    job = job_in_state("queued")
    _retry_with(job.id, "TIME_LIMIT", "w1")
    claimed = job_claim(job_id=job.id, locked_by="w2")
    job_fail_with_dead_letter(
        job_id=job.id,
        reason="nonretryable",
        actor=WORKER,
        error_code="TIME_LIMIT",
        error_message="again",
        fence=Fence("w2", claimed.attempts),
    )
    assert job_time_limit_retries(job_id=job.id) == 1
    result = dead_letters_replay(
        actor_user=OperatorFactory(), justification="limit raised", job_ids=[job.id]
    )
    assert result.job_ids == [str(job.id)]
    assert job_time_limit_retries(job_id=job.id) == 0


@pytest.mark.parametrize("attempt", [1, 2, 3, 6, 10])
def test_backoff_stays_within_its_formula_bounds(attempt):
    cap, base = 20, 2.0
    bound = min(cap, base * 2 ** (attempt - 1))
    delays = [backoff_delay(attempt=attempt, cap=cap, base=base) for _ in range(200)]
    assert all(0.5 * bound <= d <= 1.5 * bound for d in delays)
    assert max(delays) - min(delays) > 0.1 * bound  # jittered, not constant


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (TransientExternalError("x"), ("retry", "TRANSIENT_EXTERNAL")),
        (RuntimeError("x"), ("retry", "UNEXPECTED_RuntimeError")),
        (SoftTimeLimitExceeded(), ("retry", "TIME_LIMIT")),
        (JobValidationError("x"), ("nonretryable", "VALIDATION")),
        (FatalError("x"), ("fatal", "FATAL")),
        (IntegrityError("x"), ("fatal", "INTEGRITY")),
    ],
)
def test_errors_are_classified_by_the_taxonomy(exc, expected):
    assert classify(exc) == expected
