"""The execution core (jobs.execution) both executors adapt, in process: the soft limit's
class is the adapter's, a Celery delivery's end goes through the one completer, and both
executors beat through the one heartbeat loop (docs/architecture.md#executors)."""

from __future__ import annotations

import multiprocessing
import time

import pytest
import structlog
from celery.exceptions import Reject, SoftTimeLimitExceeded
from django.db import OperationalError

from jobs.execution import complete, heartbeat
from jobs.execution import run as core
from jobs.execution.context import JobContext
from jobs.execution.heartbeat import HeartbeatLoop
from jobs.execution.limits import SoftLimit
from jobs.execution.run import DB_DOWN, ENDED, LOST, LOST_DECIDING, run_claimed
from jobs.models import Job
from jobs.processes import runtime
from jobs.processes.executor import Host
from jobs.processes.runtime import job_execute
from jobs.services import Fence, job_claim
from tests.factories import job_in_state
from tests.metric_samples import Moved
from tests.polling import wait_for
from tests.processes import scripted_table

pytestmark = pytest.mark.django_db


class AdapterLimit(Exception):
    """A soft limit class of a delivery other than Celery."""


def raises_the_adapters_limit(ctx, params):
    raise AdapterLimit("soft time limit exceeded")


def raises_celerys_limit(ctx, params):
    raise SoftTimeLimitExceeded("soft time limit exceeded")


def succeeds(ctx, params):
    return {"ok": True}


def claimed(settings, handler) -> tuple[Job, Fence]:
    scripted_table(settings, cam={"handler": f"{__name__}.{handler.__name__}", "max_retries": 2})
    job = job_in_state("queued", job_type="cam", params={"do": handler.__name__})
    job = job_claim(job_id=job.id, locked_by="core-test")
    assert job is not None
    return job, Fence("core-test", job.attempts)


def decide(job: Job, fence: Fence, limit: SoftLimit):
    ended = run_claimed(
        job=job,
        fence=fence,
        log=structlog.get_logger("test"),
        soft_limit=limit,
        heartbeats=None,
        write_end=lambda finish, _run: finish,
    )
    assert ended.outcome == ENDED and ended.finish is not None
    return ended.finish


def test_the_soft_limit_the_core_classifies_is_the_class_its_adapter_gives(settings):
    job, fence = claimed(settings, raises_the_adapters_limit)
    finish = decide(job, fence, SoftLimit(AdapterLimit))
    assert (finish.target, finish.error_code) == ("retrying", "TIME_LIMIT")
    assert "ran past the cam type's soft time limit" in finish.error_message


def test_celerys_soft_limit_is_no_time_limit_to_a_core_given_another_class(settings):
    job, fence = claimed(settings, raises_celerys_limit)
    finish = decide(job, fence, SoftLimit(AdapterLimit))
    assert (finish.target, finish.error_code) == ("retrying", "UNEXPECTED_SoftTimeLimitExceeded")


def test_both_adapters_hand_the_core_celerys_soft_limit_class():
    from jobs.processes.executor_runners import SOFT_LIMIT_PROCESS, SOFT_LIMIT_THREAD

    assert runtime.SOFT_LIMIT.error is SoftTimeLimitExceeded and not runtime.SOFT_LIMIT.timer
    assert SOFT_LIMIT_PROCESS.error is SoftTimeLimitExceeded and SOFT_LIMIT_PROCESS.timer
    assert SOFT_LIMIT_THREAD.error is SoftTimeLimitExceeded and not SOFT_LIMIT_THREAD.timer


def _sleep_under(limit: SoftLimit, answer) -> None:
    limit.install()
    try:
        with limit.armed(0.05):
            time.sleep(10)
    except AdapterLimit:
        answer.send("caught")
    else:
        answer.send("slept")


def test_an_armed_timer_raises_the_given_class_in_the_main_thread():
    """In a child process of its own, as a run_worker runner (the test process's SIGALRM
    is pytest-timeout's)."""
    ours, theirs = multiprocessing.Pipe()
    child = multiprocessing.get_context("fork").Process(
        target=_sleep_under, args=(SoftLimit(AdapterLimit, timer=True), theirs)
    )
    child.start()
    try:
        assert ours.poll(5) and ours.recv() == "caught"
    finally:
        child.join(timeout=5)


def test_a_celery_delivery_writes_its_end_through_the_one_completer(settings, monkeypatch):
    scripted_table(settings, cam={"handler": f"{__name__}.succeeds"})
    job = job_in_state("queued", job_type="cam", params={"do": "succeeds"})
    batches = []
    jobs_complete = complete.jobs_complete

    def counted(*, finishes, locked_by):
        batches.append([f.job_id for f in finishes])
        return jobs_complete(finishes=finishes, locked_by=locked_by)

    monkeypatch.setattr(complete, "jobs_complete", counted)
    assert job_execute(payload={"job_id": str(job.id)}, hostname="core-test")["outcome"] == (
        "succeeded"
    )
    assert batches == [[job.id]]  # a batch of one, through jobs_complete
    assert Job.objects.get(id=job.id).status == "succeeded"


def test_both_executors_beat_through_the_one_heartbeat_loop():
    assert isinstance(runtime.HEARTBEATS, HeartbeatLoop)
    host = Host(queues=["sim"], concurrency=1, pool="threads", prefetch=1)
    assert isinstance(host.heartbeats, HeartbeatLoop)


@pytest.mark.django_db(transaction=True)
def test_members_due_within_half_a_heartbeat_are_beaten_by_one_statement(settings, monkeypatch):
    """A host's jobs claimed a moment apart share a beat: one statement, not one each."""
    settings.JOBOPS_HEARTBEAT_SECONDS = 0.5
    beats: list[set[str]] = []
    jobs_heartbeat = heartbeat.jobs_heartbeat

    def recorded(*, held):
        beats.append({str(job_id) for job_id in held})
        return jobs_heartbeat(held=held)

    monkeypatch.setattr(heartbeat, "jobs_heartbeat", recorded)
    loop = HeartbeatLoop(autostart=False)
    members = []
    for _ in range(2):
        job = job_claim(job_id=job_in_state("queued").id, locked_by="core-test")
        assert job is not None
        fence = Fence("core-test", job.attempts)
        members.append(JobContext(job=job, fence=fence, log=structlog.get_logger("test")))
    loop.add(members[0])
    time.sleep(0.1)  # the second claimed later, within half a heartbeat of the first
    loop.add(members[1])
    loop.start()
    try:
        wait_for(lambda: beats, timeout=10, what="the first beat")
    finally:
        loop.stop(timeout=5)  # its thread closes its own connection
    assert beats[0] == {str(m.job_id) for m in members}


# --- every way a run ends comes back to the adapter, never raised ------------------------


def fails_after_a_takeover(ctx, params):
    """The reaper reclaimed the job and another worker claimed it while this one ran."""
    Job.objects.filter(id=ctx.job_id).update(locked_by="w2", attempts=ctx.attempt + 1)
    raise RuntimeError("too late")


def loses_its_lock(ctx, params):
    Job.objects.filter(id=ctx.job_id).update(locked_by="w2", attempts=ctx.attempt + 1)
    ctx.progress(50)  # refused: JobLost in the handler


def ended(job: Job, fence: Fence, write_end=lambda finish, _run: finish):
    return run_claimed(
        job=job,
        fence=fence,
        log=structlog.get_logger("test"),
        soft_limit=SoftLimit(AdapterLimit),
        heartbeats=None,
        write_end=write_end,
    )


def test_the_database_away_at_the_gate_ends_before_the_run(settings, monkeypatch):
    job, fence = claimed(settings, succeeds)

    def down(**_):
        raise OperationalError("the database is away")

    monkeypatch.setattr(core, "connector_gate", down)
    result = ended(job, fence)
    assert (result.outcome, result.run) == (DB_DOWN, None)
    assert isinstance(result.error, OperationalError)


def test_a_lock_lost_in_the_handler_ends_lost_and_writes_nothing(settings):
    job, fence = claimed(settings, loses_its_lock)
    written = []
    result = ended(job, fence, write_end=lambda finish, _run: written.append(finish))
    assert result.outcome == LOST and result.run is not None and written == []


def test_a_lock_lost_while_deciding_ends_lost_deciding(settings):
    job, fence = claimed(settings, fails_after_a_takeover)
    result = ended(job, fence)
    assert (result.outcome, result.finish) == (LOST_DECIDING, None)


def test_the_database_away_at_the_write_ends_undecided(settings):
    job, fence = claimed(settings, succeeds)

    def down(finish, run):
        raise OperationalError("the database is away")

    result = ended(job, fence, write_end=down)
    assert result.outcome == DB_DOWN and result.run is not None
    assert Job.objects.get(id=job.id).status == "running"  # the reaper's, once stale


def test_a_celery_delivery_lost_while_deciding_is_acked_and_counted_lost(settings):
    scripted_table(settings, cam={"handler": f"{__name__}.fails_after_a_takeover"})
    job = job_in_state("queued", job_type="cam", params={"do": "fails_after_a_takeover"})
    moved = Moved()
    summary = job_execute(payload={"job_id": str(job.id)}, hostname="core-test")
    assert summary == {"job_id": str(job.id), "outcome": "lost"}
    assert moved("jobs_lost_total", type="cam") == 1


@pytest.mark.django_db(transaction=True)
def test_a_celery_delivery_that_cannot_write_its_end_hands_the_message_back(settings, monkeypatch):
    settings.JOBOPS_DB_DOWN_REQUEUE_DELAY_SECONDS = 0
    scripted_table(settings, cam={"handler": f"{__name__}.succeeds"})
    job = job_in_state("queued", job_type="cam", params={"do": "succeeds"})

    def down(**_):
        raise OperationalError("the database is away")

    monkeypatch.setattr(complete, "jobs_complete", down)
    with pytest.raises(Reject) as rejected:
        job_execute(payload={"job_id": str(job.id)}, hostname="core-test")
    assert rejected.value.requeue is True
    assert Job.objects.get(id=job.id).status == "running"  # nothing decided
