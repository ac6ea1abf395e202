"""Time limits and a handler that kills its worker (docs/architecture.md): both end through
the worker-lost path (reaper: retry, then a `worker_lost` dead letter), not a loop."""

from __future__ import annotations

import pytest

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


@pytest.fixture(scope="module")
def _cam_processes(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        with celery_worker(queues=["cam"], concurrency=2, env=scripted_env(cam=CAM), name="cam"):
            with dispatcher_process():
                yield


@pytest.fixture
def cam_worker(_cam_processes, settings):
    scripted_table(settings, cam=CAM)


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


def test_soft_time_limit_is_retryable(cam_worker):
    job = make_job(job_type="cam", params={"do": "sleep", "seconds": 30})
    done = job_finished(job.id)
    assert done.status == "failed" and done.attempts == 2
    assert "retrying" in job_events(job.id)
    row = DeadLetter.objects.get(job_id=job.id)
    assert (row.reason, row.error_code) == ("exhausted", "TIME_LIMIT")
