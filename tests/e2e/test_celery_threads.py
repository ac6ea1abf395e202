"""The Celery path under the threads pool (the Procfile's light worker group,
docs/architecture.md#claim-heartbeat-reaper): the deliveries that start together are
claimed in one statement by the core's claimer, and the ends of tasks that finish
together are written in one transaction by the core's completer, each task acked only
after its end committed; the core enforces the hard time limit the pool does not (the
run is abandoned, the reaper reclaims the job). Killing such a worker mid-job is
tests/e2e/test_execution_death.py's, for both pools."""

from __future__ import annotations

import pytest
from django.db import connection

from jobs.models import DeadLetter, Job
from jobs.services import publish_due_once
from tests import handlers
from tests.factories import make_job
from tests.processes import (
    assert_chain_valid,
    celery_worker,
    dispatcher_process,
    entries_per_transaction,
    job_events,
    job_finished,
    scripted_env,
    scripted_table,
)
from tests.queues import topology_declare_and_purge

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("broker")]

THREADS = ("--pool", "threads")


def test_threads_pool_runs_each_job_once_with_claims_and_ends_batched(scripted):
    topology_declare_and_purge()
    jobs = [make_job(job_type="ai", params={"do": "noop"}) for _ in range(60)]
    # The first jobs queued before the worker starts (the broker holds a window of a
    # queue's jobs; the dispatcher publishes the others as they end): its threads run
    # together from the start.
    publish_due_once()
    env = scripted_env()
    with celery_worker(
        queues=["default"], concurrency=6, prefetch_multiplier=3, env=env, extra_args=THREADS
    ) as worker:
        with dispatcher_process():
            done = [job_finished(job.id) for job in jobs]
        assert "threads pool: claims and ends batched across 6 tasks" in worker.log_text()
    assert {(job.status, job.attempts) for job in done} == {("succeeded", 1)}
    for job in jobs:
        assert [run["attempt"] for run in handlers.runs(job.id)] == [1]
        assert handlers.overlaps(job.id) == 0
        assert job_events(job.id).count("succeeded") == 1
    for event_type in ("started", "succeeded"):
        sizes = entries_per_transaction([job.id for job in jobs], event_type)
        assert sum(sizes) == len(jobs)
        # Several claims, and several ends, shared a statement and its transaction (at
        # most one per thread of the pool).
        assert 2 <= sizes[0] <= 6 and len(sizes) < len(jobs), (event_type, sizes)
    for job in jobs[:5]:
        assert_chain_valid(job.id)


def test_threads_pool_acks_do_not_wait_for_the_event_loop(scripted):
    """Celery hands a pool thread's late ack to its event loop without waking it: with
    the prefetch window full nothing else wakes it but its timers, and each window of
    jobs waited seconds for them (config.celery.JobopsConsumer wakes it)."""
    topology_declare_and_purge()
    jobs = [make_job(job_type="ai", params={"do": "noop"}) for _ in range(40)]
    publish_due_once()
    env = scripted_env()
    # One message reserved per thread: ten windows of four, each freed by its acks.
    with celery_worker(
        queues=["default"], concurrency=4, prefetch_multiplier=1, env=env, extra_args=THREADS
    ):
        done = [job_finished(job.id) for job in jobs]
    assert {job.status for job in done} == {"succeeded"}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM max(ts) - min(ts)) FROM audit_logs"
            " WHERE job_id = ANY(%s) AND event_type IN ('started', 'succeeded')",
            [[str(job.id) for job in jobs]],
        )
        seconds = float(cursor.fetchone()[0])
    assert seconds < 8, f"40 no-op jobs took {seconds:.1f} s"


# Waits out a hard limit and the reaper for every attempt: in `make test-heavy`.
@pytest.mark.heavy
def test_threads_pool_abandons_a_run_past_its_hard_limit_to_the_reaper(scripted):
    """The threads pool raises no time limit: the core's heartbeat loop stops beating for
    the run at its hard limit, the reaper reclaims the job, and the handler's late return
    writes nothing (its end is refused); the second attempt the same: worker_lost."""
    ai = {"max_retries": 1, "soft_time_limit": 1, "time_limit": 2}
    scripted_table(scripted, ai=ai)
    topology_declare_and_purge()
    env = scripted_env(ai=ai)
    with celery_worker(
        queues=["default"], concurrency=2, env=env, extra_args=THREADS, name="limits"
    ) as worker:
        with dispatcher_process():
            # Sleeps 4 s: past its hard limit of 2 s, then returns (its thread is freed).
            job = make_job(job_type="ai", params={"do": "sleep_past_hard_limit", "seconds": 4})
            done = job_finished(job.id, timeout=60)
        log = worker.log_text()
    assert done.status == "failed" and done.attempts == 2
    assert DeadLetter.objects.get(job_id=job.id).reason == "worker_lost"
    trail = job_events(job.id)
    assert "reclaimed" in trail and "succeeded" not in trail
    assert log.count("job_hard_time_limit") >= 2  # each attempt abandoned at its limit
    assert Job.objects.get(id=job.id).result is None  # the late returns wrote nothing
    assert [run["attempt"] for run in handlers.runs(job.id)] == [1, 2]
    assert handlers.overlaps(job.id) == 0
    assert_chain_valid(job.id)
