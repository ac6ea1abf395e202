"""JobContext and the worker write paths, in process (no subprocess needed)."""

from __future__ import annotations

import uuid

import pytest
import structlog
from celery.exceptions import Reject, SoftTimeLimitExceeded
from django.db import IntegrityError, connection
from django.db.models import F

from audit.models import AuditLog
from audit.services import Actor
from dlq.services.replay import dead_letters_replay
from jobs.domain.errors import (
    FatalError,
    JobCancelled,
    JobValidationError,
    ResultInvalidError,
    TransientExternalError,
)
from jobs.domain.exceptions import JobLost
from jobs.models import Artefact, DeadLetter, Job
from jobs.processes.runtime import Heartbeats, JobContext, classify, job_execute
from jobs.selectors import job_time_limit_retries
from jobs.services import (
    WORKER,
    Fence,
    artefact_save,
    backoff_delay,
    job_cancel,
    job_claim,
    job_fail_with_dead_letter,
    job_heartbeat,
    job_lock_state,
    job_reclaim,
    job_retry,
    job_succeed,
    validate_result,
)
from tests.factories import OperatorFactory, backdate, job_in_state
from tests.polling import wait_for
from tests.processes import job_events, scripted_table

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


def test_a_taken_over_workers_heartbeat_lock_check_and_artefact_are_refused():
    job, fence = claimed()
    # The reaper reclaimed the job and another worker claimed it, behind w1's back.
    Job.objects.filter(id=job.id).update(locked_by="w2", attempts=2)
    with pytest.raises(JobLost):
        job_heartbeat(job_id=job.id, fence=fence)
    with pytest.raises(JobLost):
        job_lock_state(job_id=job.id, fence=fence)
    with pytest.raises(JobLost):
        artefact_save(job_id=job.id, kind="out", name="late.txt", data=b"late", fence=fence)
    row = Job.objects.get(id=job.id)
    assert (row.locked_by, row.locked_at, row.version) == ("w2", job.locked_at, job.version)
    assert not Artefact.objects.filter(job_id=job.id).exists()


def test_a_result_must_store_as_canonical_json_within_the_payload_limit(settings):
    validate_result(None)  # a handler may return nothing
    validate_result({"ok": True, "n": 2**53 - 1})
    with pytest.raises(ResultInvalidError, match="not canonical JSON"):
        validate_result({"n": 2**60})  # beyond what a JSON number carries exactly
    settings.JOBOPS_MAX_PAYLOAD_BYTES = 100
    with pytest.raises(ResultInvalidError, match=r"is \d+ bytes \(at most 100\)"):
        validate_result({"text": "x" * 200})


HEARTBEAT_SESSIONS = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
    " AND pid <> pg_backend_pid() AND query LIKE 'UPDATE jobs SET locked_at = now()%%'"
)


def heartbeat_session() -> int | None:
    """The backend of the heartbeat thread's own connection, once it has beaten."""
    with connection.cursor() as cursor:
        cursor.execute(HEARTBEAT_SESSIONS)
        row = cursor.fetchone()
    return row[0] if row else None


def terminate(pid: int) -> None:
    """End a database session, as a database restart does; returns once it is gone."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])


@pytest.fixture
def heartbeats(settings):
    """A heartbeat thread of the test's own, beating every 0.1 s. The thread lives as
    long as the process, with its own database connection: the test ends that session,
    or the test database could not be dropped."""
    settings.JOBOPS_HEARTBEAT_SECONDS = 0.1
    yield Heartbeats()
    while (pid := heartbeat_session()) is not None:
        terminate(pid)


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_that_finds_its_job_taken_over_stops_the_handler(heartbeats, json_log_lines):
    job, fence = claimed()
    ctx = JobContext(job=job, fence=fence, log=structlog.get_logger("jobs.runtime"))
    heartbeats.add(ctx)
    try:
        Job.objects.filter(id=job.id).update(locked_by="w2", attempts=2)
        wait_for(
            lambda: any(line["event"] == "job_lock_lost" for line in json_log_lines()),
            what="the heartbeat to see the lock lost",
        )
    finally:
        heartbeats.remove(ctx)
    with pytest.raises(JobLost):
        ctx.progress(50)  # refused without a write: the handler stops at its next call
    assert Job.objects.get(id=job.id).version == job.version


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_that_loses_its_connection_beats_again_on_a_new_one(heartbeats, json_log_lines):
    job, fence = claimed()
    ctx = JobContext(job=job, fence=fence, log=structlog.get_logger("jobs.runtime"))
    heartbeats.add(ctx)
    try:
        first = wait_for(heartbeat_session, what="the first beat")
        terminate(first)
        wait_for(
            lambda: any(line["event"] == "heartbeat_failed" for line in json_log_lines()),
            what="the beat on the lost connection to fail",
        )
        wait_for(
            lambda: heartbeat_session() not in (None, first), what="a beat on a new connection"
        )
        beaten = Job.objects.get(id=job.id).locked_at
        wait_for(lambda: Job.objects.get(id=job.id).locked_at > beaten, what="a later beat")
    finally:
        heartbeats.remove(ctx)
    ctx.progress(50)  # the job is still this worker's
    assert Job.objects.get(id=job.id).progress_percent == 50


# Handlers of a `cam` job run in this process by job_execute, as a worker runs them.
def returns_a_number(ctx, params):
    return 42


def reports_progress_then_fails(ctx, params):
    ctx.progress(40, step="half")  # written at once: the first value
    ctx.progress(70, step="most")  # coalesced: waits for the interval
    raise FatalError("planned fatal error", code="PLANNED_FATAL")


def loses_its_job_meanwhile(ctx, params):
    # The reaper reclaimed the job and another worker claimed it while this handler
    # ran without a word to its ctx (no progress, no cancel check).
    Job.objects.filter(id=ctx.job_id).update(locked_by="w2", attempts=F("attempts") + 1)
    return {"ok": True}


def executed(settings, handler):
    """A queued `cam` job run by `handler` through job_execute; (summary, job as stored)."""
    scripted_table(settings, cam={"handler": f"{__name__}.{handler.__name__}"})
    job = job_in_state("queued", job_type="cam", params={"do": handler.__name__})
    summary = job_execute(payload={"job_id": str(job.id)}, hostname="test-host")
    return summary, Job.objects.get(id=job.id)


def test_a_message_naming_an_unknown_job_is_rejected_without_requeue():
    with pytest.raises(Reject) as rejected:
        job_execute(payload={"job_id": str(uuid.uuid4())}, hostname="test-host")
    assert rejected.value.requeue is False


def test_a_result_that_is_not_an_object_is_stored_under_value(settings):
    summary, job = executed(settings, returns_a_number)
    assert summary["outcome"] == "succeeded"
    assert (job.status, job.result) == ("succeeded", {"value": 42})


def test_progress_left_waiting_is_written_before_the_job_is_dead_lettered(settings):
    settings.JOBOPS_PROGRESS_INTERVAL_SECONDS = 60
    with pytest.raises(Reject) as rejected:
        executed(settings, reports_progress_then_fails)
    assert rejected.value.requeue is False  # the broker copy goes to the DLQ
    job = Job.objects.get(type="cam")
    assert (job.status, job.progress_percent, job.last_error_code) == (
        "failed",
        70,
        "PLANNED_FATAL",
    )
    assert job_events(job.id)[-3:] == ["progress", "progress", "failed"]
    assert DeadLetter.objects.get(job_id=job.id).reason == "fatal"


def test_a_handler_whose_job_was_taken_over_ends_without_a_write(settings):
    summary, job = executed(settings, loses_its_job_meanwhile)
    assert summary["outcome"] == "lost"
    assert (job.status, job.locked_by, job.result) == ("running", "w2", None)
    assert job_events(job.id)[-1] == "started"
