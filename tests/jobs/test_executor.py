"""The postgres executor's batch statements (docs/postgres-executor.md): the claim, the
completions and the heartbeat, each for many jobs in one statement, against the
database directly; and what the dispatcher, the DLQ pages and run_worker make of a
postgres queue."""

from __future__ import annotations

import json
import signal
import sys
import threading
from datetime import timedelta

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from audit.models import AuditLog
from audit.services import Actor
from jobs.domain.states import Status
from jobs.models import DeadLetter, Job
from jobs.services import (
    Fence,
    Finish,
    jobs_claim,
    jobs_finish,
    jobs_heartbeat,
    publish_due_once,
    reap_once,
)
from jobs.services.cancellation import job_cancel
from jobs.services.queues import queue_pause, queue_resume
from tenants.services import organisation_suspend
from tests.factories import OrganisationFactory, UserFactory, backdate, fence_of, make_job
from tests.polling import wait_for
from tests.processes import (
    Process,
    assert_chain_valid,
    database_url,
    job_events,
    subprocess_env,
)

pytestmark = pytest.mark.django_db

HOLDER = "host-a:1:test"


@pytest.fixture(autouse=True)
def sim_on_postgres(settings):
    settings.JOBOPS_QUEUE_EXECUTORS = {**settings.JOBOPS_QUEUE_EXECUTORS, "sim": "postgres"}


def _prioritised(priority: int) -> Job:
    job = make_job()
    Job.objects.filter(id=job.id).update(priority=priority)
    return job


def test_a_claim_takes_the_highest_priority_first_then_the_oldest_up_to_its_limit():
    low, high, high_later = _prioritised(2), _prioritised(8), _prioritised(8)
    claimed = jobs_claim(queues=["sim"], locked_by=HOLDER, limit=2)
    assert [j.id for j in claimed] == [high.id, high_later.id]
    assert {(j.status, j.locked_by, j.attempts) for j in claimed} == {("running", HOLDER, 1)}
    assert Job.objects.get(id=low.id).status == "pending"
    # Each claimed job has its own `started` entry, on a chain that still verifies.
    for job in claimed:
        assert job_events(job.id) == ["created", "started"]
        assert_chain_valid(job.id)


def test_a_claim_takes_due_retries_and_leaves_those_not_yet_due():
    due, later = make_job(), make_job()
    assert len(jobs_claim(queues=["sim"], locked_by=HOLDER, limit=2)) == 2
    jobs_finish(
        finishes=[
            Finish(due.id, 1, Status.RETRYING, error_code="X", delay=0),
            Finish(later.id, 1, Status.RETRYING, error_code="X", delay=3600),
        ],
        locked_by=HOLDER,
    )
    assert [j.id for j in jobs_claim(queues=["sim"], locked_by=HOLDER, limit=5)] == [due.id]
    assert Job.objects.get(id=later.id).status == "retrying"


def test_a_claim_skips_paused_queues_suspended_organisations_and_skipped_types():
    held_org = OrganisationFactory()
    suspended = make_job(owner=UserFactory(org=held_org))
    organisation_suspend(org=held_org)
    skipped = make_job()
    assert jobs_claim(queues=["sim"], locked_by=HOLDER, limit=5, skip_types=["sim"]) == []
    queue_pause(queue="sim", reason="maintenance", actor=Actor.system("test"))
    assert jobs_claim(queues=["sim"], locked_by=HOLDER, limit=5) == []
    queue_resume(queue="sim", reason="done", actor=Actor.system("test"))
    [claimed] = jobs_claim(queues=["sim"], locked_by=HOLDER, limit=5)
    assert claimed.id == skipped.id
    assert Job.objects.get(id=suspended.id).status == "pending"


def test_a_claim_takes_only_the_queues_it_names():
    make_job()
    assert jobs_claim(queues=["report"], locked_by=HOLDER, limit=5) == []


def test_one_completion_whose_fence_failed_is_lost_and_the_others_are_written():
    jobs = [make_job() for _ in range(3)]
    jobs_claim(queues=["sim"], locked_by=HOLDER, limit=3)
    reclaimed = jobs[1]
    backdate(reclaimed, locked_at=600)
    assert reap_once()["reclaimed"] == 1  # the job was reclaimed from under its host
    assert Job.objects.get(id=reclaimed.id).status == "retrying"
    finishes = [
        Finish(job.id, 1, Status.SUCCEEDED, result={"n": n}, progress={"percent": 40, "step": "s"})
        for n, job in enumerate(jobs)
    ]
    lost = jobs_finish(finishes=finishes, locked_by=HOLDER)
    assert [f.job_id for f in lost] == [reclaimed.id]
    for n, job in enumerate(jobs):
        stored = Job.objects.get(id=job.id)
        if job is reclaimed:
            assert stored.status == "retrying" and stored.result is None
            assert job_events(job.id)[-1] == "reclaimed"
        else:
            assert (stored.status, stored.result, stored.progress_percent) == (
                "succeeded",
                {"n": n},
                100,
            )
            assert stored.progress_step == "s" and stored.locked_by is None
            assert job_events(job.id) == ["created", "started", "succeeded"]
        assert_chain_valid(job.id)


def test_a_batch_of_retries_writes_each_jobs_own_error_delay_and_progress():
    first, second = make_job(), make_job()
    jobs_claim(queues=["sim"], locked_by=HOLDER, limit=2)
    lost = jobs_finish(
        finishes=[
            Finish(first.id, 1, Status.RETRYING, error_code="A", error_message="a", delay=0),
            Finish(
                second.id,
                1,
                Status.RETRYING,
                error_code="B",
                error_message="b",
                delay=3600,
                progress={"percent": 30, "step": "3/10", "message": None},
            ),
        ],
        locked_by=HOLDER,
    )
    assert lost == []
    a, b = Job.objects.get(id=first.id), Job.objects.get(id=second.id)
    assert (a.status, a.last_error_code, a.last_error_message) == ("retrying", "A", "a")
    assert (b.last_error_code, b.progress_percent, b.progress_step) == ("B", 30, "3/10")
    assert b.next_run_at - a.next_run_at > timedelta(minutes=59)
    entry = AuditLog.objects.get(job_id=second.id, event_type="retrying")
    assert json.loads(entry.payload)["data"]["error_code"] == "B"
    assert json.loads(entry.payload)["data"]["delay_ms"] == 3_600_000
    assert_chain_valid(second.id)


def test_a_failed_run_gets_a_dead_letter_without_a_broker_copy():
    job = make_job()
    jobs_claim(queues=["sim"], locked_by=HOLDER, limit=1)
    finish = Finish(
        job.id, 1, Status.FAILED, error_code="BAD", error_message="bad", reason="nonretryable"
    )
    assert jobs_finish(finishes=[finish], locked_by=HOLDER) == []
    stored = Job.objects.get(id=job.id)
    assert (stored.status, stored.dead_letter_queue) == ("failed", "sim_dlq")
    [row] = DeadLetter.objects.filter(job_id=job.id)
    assert (row.queue, row.reason, row.broker_copy, row.state) == (
        "sim_dlq",
        "nonretryable",
        False,
        "open",
    )


def test_one_heartbeat_refreshes_every_held_lock_and_brings_cancel_flags():
    jobs = [make_job() for _ in range(3)]
    claimed = jobs_claim(queues=["sim"], locked_by=HOLDER, limit=3)
    backdate(jobs[0], locked_at=30)
    job_cancel(job_id=jobs[1].id, actor=Actor.system("test"))
    held = {job.id: fence_of(job) for job in claimed}
    held[jobs[2].id] = Fence(HOLDER, 99)  # not this attempt: lost
    flags = jobs_heartbeat(held=held)
    assert flags == {jobs[0].id: False, jobs[1].id: True}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT now() - locked_at < interval '5 s' FROM jobs WHERE id = %s", [jobs[0].id]
        )
        assert cursor.fetchone()[0]


def test_the_dispatcher_publishes_no_job_of_a_postgres_queue():
    job = make_job()
    assert publish_due_once() == 0
    assert Job.objects.get(id=job.id).status == "pending"


@pytest.mark.django_db(transaction=True)
def test_two_claimers_never_take_the_same_job():
    """A claimer holding its rows (its transaction still open) is skipped, not waited on."""
    jobs = [make_job() for _ in range(4)]
    other = psycopg.connect(database_url())
    try:
        with other.transaction():
            rows = other.execute(
                "SELECT id FROM jobs WHERE queue = 'sim' ORDER BY created_at LIMIT 2 "
                "FOR UPDATE SKIP LOCKED"
            ).fetchall()
            held = {row[0] for row in rows}
            done = threading.Event()
            result: list[Job] = []

            def claim() -> None:
                result.extend(jobs_claim(queues=["sim"], locked_by=HOLDER, limit=4))
                connection.close()
                done.set()

            thread = threading.Thread(target=claim)
            thread.start()
            assert done.wait(10), "the claim waited on rows another claimer holds"
            thread.join()
    finally:
        other.close()
    assert {j.id for j in result} == {j.id for j in jobs} - held
    assert len(result) == 2


@pytest.mark.parametrize(
    ("queues", "message"),
    [("report", "runs on celery"), ("nosuch", "unknown queue"), ("sim,report", "runs on celery")],
)
def test_run_worker_refuses_a_queue_that_is_not_configured_postgres(queues, message):
    with pytest.raises(CommandError, match=message):
        call_command("run_worker", "--queues", queues)


def test_run_worker_with_no_queue_configured_postgres_refuses_to_start_unless_idle_ok(settings):
    """By hand, a run_worker with nothing to run says so and exits; the Procfile's
    (`--idle-ok`) stays up without a word at the usual log level: every queue on Celery
    is the usual case with a broker."""
    settings.JOBOPS_QUEUE_EXECUTORS = dict.fromkeys(settings.JOBOPS_QUEUE_EXECUTORS, "celery")
    with pytest.raises(CommandError, match="no queue is configured postgres"):
        call_command("run_worker")
    # At debug level, so that its one line is the evidence that it reached its wait (its
    # SIGTERM handler installed just before): under coverage, whose own SIGTERM handler
    # is there from the start, the process's signal mask says nothing of which it is.
    idle = Process(
        [sys.executable, "manage.py", "run_worker", "--idle-ok"],
        subprocess_env(LOG_LEVEL="DEBUG"),
        "rw-idle",
    )
    try:
        wait_for(lambda: "run_worker_idle" in idle.log_text() or not idle.alive(), timeout=30)
        assert idle.alive(), idle.log_text()
        idle.proc.send_signal(signal.SIGTERM)
        assert idle.proc.wait(timeout=10) == 0, idle.log_text()
    finally:
        idle.stop()
    # Its only line is at debug level: at the usual level (INFO) it says nothing.
    lines = [line for line in idle.log_text().splitlines() if "run_worker_idle" in line]
    assert len(lines) == 1 and "debug" in lines[0].lower(), idle.log_text()
    assert "warning" not in idle.log_text().lower()


def test_run_worker_refuses_a_concurrency_out_of_bounds():
    with pytest.raises(CommandError, match="1-256"):
        call_command("run_worker", "--queues", "sim", "--concurrency", "0")


def test_the_dlq_overview_says_a_postgres_queue_has_no_broker_dlq():
    from dlq.selectors import dlq_overview

    rows = {row["queue"]: row for row in dlq_overview(org_ids=[])}
    assert rows["sim_dlq"]["broker_dlq"] is False and rows["sim_dlq"]["depth"] is None
    assert rows["report_dlq"]["broker_dlq"] is True
