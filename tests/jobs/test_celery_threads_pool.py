"""The Celery adapter under the threads pool, in process (jobs.processes.runtime,
jobs.execution.complete.Completer): tasks that end together share one transaction and
none returns (so none is acked) before it committed; a window the database refuses hands
every task's message back; a run past its hard limit is abandoned by the heartbeat loop.
The real worker's runs are tests/e2e/test_celery_threads.py's."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import structlog
from celery.exceptions import Reject
from django.db import OperationalError, connection

from jobs.domain.exceptions import JobLost
from jobs.execution import complete
from jobs.execution.context import JobContext
from jobs.execution.heartbeat import HeartbeatLoop
from jobs.models import Job
from jobs.processes import runtime
from jobs.processes.runtime import job_execute
from jobs.services import Fence, job_claim
from tests.factories import job_in_state
from tests.polling import wait_for
from tests.processes import scripted_table

pytestmark = pytest.mark.django_db(transaction=True)


def succeeds(ctx, params):
    return {"ok": True}


@pytest.fixture
def threads_pool(settings, monkeypatch):
    """This process as a threads-pool worker of three threads."""
    scripted_table(settings, cam={"handler": f"{__name__}.succeeds"})
    settings.JOBOPS_DB_DOWN_REQUEUE_DELAY_SECONDS = 0
    pool = runtime._ThreadsPool(concurrency=3, hostname="threads-test")
    monkeypatch.setattr(runtime, "THREADS", pool)
    yield pool
    pool.completer.stop(timeout=5)  # its thread closes its own connection
    pool.heartbeats.stop(timeout=5)


def _deliver(jobs: list[Job]) -> list[tuple[float, object]]:
    """Each job's delivery in a thread of its own, as the pool runs them: when each
    returned, and what (its summary, or what it raised)."""

    def one(job: Job) -> tuple[float, object]:
        try:
            answer: object = job_execute(payload={"job_id": str(job.id)}, hostname="t")
        except Reject as exc:
            answer = exc
        finally:
            connection.close()  # this thread's own
        return time.monotonic(), answer

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        return list(pool.map(one, jobs))


def test_tasks_ending_together_share_a_transaction_and_return_after_its_commit(
    threads_pool, monkeypatch
):
    # A long window: it closes because every thread of the pool waits on it.
    monkeypatch.setattr(complete, "COMPLETE_WINDOW_SECONDS", 5.0)
    jobs = [job_in_state("queued", job_type="cam", params={"do": "succeeds"}) for _ in range(3)]
    batches: list[tuple[set[str], str, float]] = []
    jobs_complete = complete.jobs_complete

    def counted(*, finishes, locked_by):
        completion = jobs_complete(finishes=finishes, locked_by=locked_by)
        batches.append(({str(f.job_id) for f in finishes}, locked_by, time.monotonic()))
        return completion

    monkeypatch.setattr(complete, "jobs_complete", counted)
    started = time.monotonic()
    returned = _deliver(jobs)
    assert [answer["outcome"] for _, answer in returned] == ["succeeded"] * 3
    # One window, one lock holder for the process, well before the window's 5 s.
    assert [(ids, holder) for ids, holder, _ in batches] == [
        ({str(job.id) for job in jobs}, threads_pool.locked_by)
    ]
    committed = batches[0][2]
    assert committed - started < 4
    assert all(at >= committed for at, _ in returned)  # none returned (acked) before
    assert set(
        Job.objects.filter(id__in=[j.id for j in jobs]).values_list("status", flat=True)
    ) == {"succeeded"}


def test_a_window_the_database_refuses_hands_every_message_back(threads_pool, monkeypatch):
    monkeypatch.setattr(complete, "COMPLETE_WINDOW_SECONDS", 5.0)
    jobs = [job_in_state("queued", job_type="cam", params={"do": "succeeds"}) for _ in range(3)]
    calls = []

    def down(**_):
        calls.append(1)
        raise OperationalError("the database is away")

    monkeypatch.setattr(complete, "jobs_complete", down)
    returned = _deliver(jobs)
    assert len(calls) == 1  # one window for the three
    assert all(isinstance(answer, Reject) and answer.requeue for _, answer in returned)
    # Nothing decided: the reaper reclaims them once their locks are stale.
    assert set(
        Job.objects.filter(id__in=[j.id for j in jobs]).values_list("status", flat=True)
    ) == {"running"}


def test_a_run_past_its_hard_limit_is_abandoned_without_waiting_for_a_heartbeat(settings):
    settings.JOBOPS_HEARTBEAT_SECONDS = 30  # the limit comes long before any beat
    job = job_claim(job_id=job_in_state("queued").id, locked_by="limits-test")
    assert job is not None
    ctx = JobContext(job=job, fence=Fence("limits-test", job.attempts), log=structlog.get_logger())
    loop = HeartbeatLoop(hard_limits=True)
    loop.start()
    try:
        time.sleep(0.2)  # the thread asleep until its next beat, 30 s away
        ctx.deadline = time.monotonic() + 0.3
        loop.add(ctx)
        wait_for(ctx._lost.is_set, timeout=5, what="the hard limit to abandon the run")
        assert ctx.job_id not in loop._members  # no more beats: the lock goes stale
        with pytest.raises(JobLost):
            ctx.progress(50)  # the handler's next call stops it
    finally:
        loop.stop(timeout=5)


def test_a_loop_without_hard_limits_never_abandons(settings):
    """run_worker's host and a prefork child: the limits are enforced elsewhere."""
    settings.JOBOPS_HEARTBEAT_SECONDS = 30
    job = job_claim(job_id=job_in_state("queued").id, locked_by="limits-test")
    assert job is not None
    ctx = JobContext(job=job, fence=Fence("limits-test", job.attempts), log=structlog.get_logger())
    ctx.deadline = time.monotonic() - 1
    loop = HeartbeatLoop()
    loop.add(ctx)
    try:
        time.sleep(0.3)
        assert not ctx._lost.is_set() and ctx.job_id in loop._members
    finally:
        loop.stop(timeout=5)


def test_a_caller_whose_completer_thread_died_is_not_left_waiting(monkeypatch):
    completer = complete.Completer(batch=2)
    monkeypatch.setattr(completer, "_start", lambda: None)  # as if it died at once
    end = complete.End(finish=None, log=structlog.get_logger(), job_type="cam")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="completer thread ended"):
        completer.write(end, locked_by="t")
