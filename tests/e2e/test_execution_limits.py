"""Time limits and a handler that kills its worker (docs/architecture.md): the hard limit
and a killed worker end through the worker-lost path (reaper: retry, then a
`worker_lost` dead letter), the soft limit after one retry; never a loop."""

from __future__ import annotations

import json

import pytest

from audit.models import AuditLog
from jobs.models import DeadLetter
from tests import handlers
from tests.factories import make_job
from tests.processes import (
    assert_chain_valid,
    celery_worker,
    dispatcher_process,
    job_events,
    job_finished,
    scripted_env,
    scripted_table,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("broker")]

# cam: two attempts, and time limits small enough to hit (soft 1 s, hard 2 s).
CAM = {"max_retries": 1, "soft_time_limit": 1, "time_limit": 2}
# model: the same soft limit, but five attempts: a time limit must not use them all. Its
# tests are about the soft limit: the hard one sits far enough behind it that a loaded
# machine handling the soft limit late never reaches the hard one (a kill by the hard
# limit is the worker-lost path, counted as any other lost worker).
MODEL = {"max_retries": 4, "soft_time_limit": 1, "time_limit": 6}


@pytest.fixture(scope="module")
def _cam_processes(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        env = scripted_env(cam=CAM, model=MODEL)
        with celery_worker(queues=["cam", "model"], concurrency=2, env=env, name="cam"):
            with dispatcher_process():
                yield


@pytest.fixture
def cam_worker(_cam_processes, settings):
    scripted_table(settings, cam=CAM, model=MODEL)


def test_handler_that_kills_its_worker_ends_failed_worker_lost(cam_worker):
    job = make_job(job_type="cam", params={"do": "kill"})
    done = job_finished(job.id)
    assert done.status == "failed" and done.attempts == 2  # max_retries 1: two attempts
    assert done.dead_letter_queue == "cam_dlq"
    row = DeadLetter.objects.get(job_id=job.id)
    assert (row.reason, row.queue, row.broker_copy) == ("worker_lost", "cam_dlq", False)
    assert job_events(job.id).count("reclaimed") == 1
    assert len(handlers.runs(job.id)) == 2  # and it does not loop
    assert_chain_valid(job.id)


def test_hard_time_limit_ends_through_the_worker_lost_path(cam_worker):
    job = make_job(job_type="cam", params={"do": "sleep_past_hard_limit", "seconds": 30})
    done = job_finished(job.id)
    assert done.status == "failed" and done.attempts == 2
    assert DeadLetter.objects.get(job_id=job.id).reason == "worker_lost"
    assert "reclaimed" in job_events(job.id)  # retried once after the first hard limit


def test_soft_time_limit_is_retried_once_then_dead_lettered(cam_worker):
    job = make_job(job_type="cam", params={"do": "sleep", "seconds": 30})
    done = job_finished(job.id)
    assert done.status == "failed" and done.attempts == 2
    assert "retrying" in job_events(job.id)  # the first time limit is retried
    row = DeadLetter.objects.get(job_id=job.id)
    # The second is not transient: non-retryable, though it was also the last attempt.
    assert (row.reason, row.error_code) == ("nonretryable", "TIME_LIMIT")


def test_a_handler_that_catches_its_soft_time_limit_ends_as_it_chooses(cam_worker):
    """The handler catches celery.exceptions.SoftTimeLimitExceeded (the class the Celery
    adapter hands the execution core) and succeeds; the postgres executor's twin is in
    tests/e2e/test_postgres_executor.py."""
    job = make_job(job_type="cam", params={"do": "catch_soft_limit", "seconds": 30})
    done = job_finished(job.id)
    assert (done.status, done.attempts, done.result) == ("succeeded", 1, {"caught": True})
    assert handlers.soft_limit_caught(job.id) == "SoftTimeLimitExceeded"
    assert_chain_valid(job.id)


def test_a_job_that_overruns_its_time_limit_twice_fails_after_two_of_five_attempts(
    cam_worker,
):
    job = make_job(job_type="model", params={"do": "sleep", "seconds": 30})
    done = job_finished(job.id)
    assert (done.status, done.attempts, done.max_attempts) == ("failed", 2, 5)
    assert done.dead_letter_queue == "model_dlq"
    assert job_events(job.id).count("retrying") == 1
    row = DeadLetter.objects.get(job_id=job.id)
    assert (row.state, row.reason, row.error_code) == ("open", "nonretryable", "TIME_LIMIT")
    assert done.last_error_code == "TIME_LIMIT"
    assert "ran past the model type's soft time limit of 1 s" in done.last_error_message
    assert "not retried again" in done.last_error_message
    assert len(handlers.runs(job.id)) == 2
    assert_chain_valid(job.id)


def test_a_retried_attempt_reports_progress_from_zero(cam_worker):
    # 10 steps of 0.15 s: attempt 1 reaches about 60 % before its 1 s limit, then
    # attempt 2 starts again from its own first step.
    params = {"do": "steps", "steps": 10, "step_seconds": 0.15}
    job = make_job(job_type="model", params=params)
    assert job_finished(job.id).status == "failed"
    entries = AuditLog.objects.filter(job_id=job.id, event_type="progress").order_by("seq")
    by_attempt: dict[int, list[int]] = {}
    for entry in entries:
        data = json.loads(entry.payload)["data"]
        by_attempt.setdefault(data["attempt"], []).append(int(data["percent"]))
    # Attempts 1 and 2 at least: on a loaded machine the hard limit can end an attempt
    # before the soft one, through the worker-lost path, which adds an attempt (the
    # attempt count itself is the test above's).
    assert {1, 2} <= set(by_attempt)
    # Each entry records the percent the row held after the write: every retried
    # attempt's first is its own 10 %, not the maximum an earlier attempt had reached.
    assert by_attempt[1][-1] > 10
    assert all(by_attempt[n][0] == 10 for n in by_attempt if n > 1)
    assert by_attempt[2] == sorted(by_attempt[2])  # monotonic within the attempt
