"""Worker death (docs/architecture.md#claim-heartbeat-reaper): kill -9, a handler that kills its
own worker, the hard time limit, and a reclaimed worker that is still alive."""

from __future__ import annotations

import signal

import pytest

from jobs.models import Job
from jobs.services import publish_due_once, reap_once
from tests import handlers
from tests.factories import make_job
from tests.polling import wait_for
from tests.processes import (
    assert_chain_valid,
    celery_worker,
    dispatcher_process,
    scripted_env,
    scripted_table,
    together,
)
from tests.processes import job_events as events
from tests.processes import job_finished as finished

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("broker")]


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_job_of_a_killed_worker_finishes_once_on_another_worker(settings, pool):
    """Under either pool (the threads pool batches its ends and holds one lock holder
    for the process: jobs.processes.runtime)."""
    scripted_table(settings)
    env = scripted_env()
    pooled = ("--pool", pool)
    with celery_worker(queues=["model"], env=env, name="doomed", extra_args=pooled) as doomed:
        # Killed at its second step, six before its end: it cannot end first.
        job = make_job(job_type="model", params={"do": "steps", "steps": 8, "step_seconds": 0.25})
        publish_due_once()  # the dispatcher's step
        wait_for(lambda: int(handlers.redis_client().get(handlers.key(job.id, "step")) or 0) >= 2)
        doomed.kill(signal.SIGKILL)  # the worker (and its pool child), mid-job
        doomed.proc.wait(timeout=10)
    assert Job.objects.get(id=job.id).status == "running"
    rescuer = celery_worker(queues=["model"], env=env, name="rescuer", extra_args=pooled)
    with together(rescuer, dispatcher_process()):
        done = finished(job.id)
    assert done.status == "succeeded" and done.attempts == 2
    trail = events(job.id)
    assert trail.count("succeeded") == 1 and "reclaimed" in trail
    assert trail.index("reclaimed") < trail.index("succeeded")
    assert handlers.overlaps(job.id) == 0  # never ran twice at the same time
    assert [r["attempt"] for r in handlers.runs(job.id)] == [1, 2]
    assert_chain_valid(job.id)


def test_reclaimed_worker_that_is_still_alive_writes_nothing(settings):
    scripted_table(settings)
    settings.JOBOPS_LOCK_TIMEOUT = 1
    # No heartbeat during the test: the lock goes stale while the handler still runs.
    env = {**scripted_env(), "JOBOPS_HEARTBEAT_SECONDS": "3600"}
    with celery_worker(queues=["model"], env=env, name="zombie") as zombie:
        job = make_job(job_type="model", params={"do": "wait_signal"})
        publish_due_once()  # the dispatcher's step
        wait_for(lambda: handlers.redis_client().get(handlers.key(job.id, "started")))
        wait_for(lambda: reap_once()["reclaimed"] == 1, timeout=10, interval=0.2)
        before = Job.objects.get(id=job.id)
        trail_before = events(job.id)
        assert before.status == "retrying" and trail_before[-1] == "reclaimed"
        handlers.redis_client().set(handlers.key(job.id, "go"), 1)
        wait_for(lambda: "job_lost_stopping" in zombie.log_text(), timeout=10)
    after = Job.objects.get(id=job.id)
    assert (after.status, after.version, after.progress_percent) == ("retrying", before.version, 0)
    assert events(job.id) == trail_before
    assert not after.artefacts.exists()
