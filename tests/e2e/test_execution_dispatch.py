"""No-loss dispatch (docs/architecture.md), cancellation before start, the worker's
prefetch guard and a database outage while a job fails."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
from django.db import connection

from audit.services import Actor
from jobs.integrations.liveness import live_processes
from jobs.models import DeadLetter, Job
from jobs.services import job_cancel, publish_due_once, reap_once
from tests import handlers
from tests.factories import UserFactory, backdate, job_in_state, make_job
from tests.polling import wait_for
from tests.processes import (
    ROOT,
    Process,
    celery_worker,
    database_url,
    dispatcher_process,
    job_events,
    job_finished,
    run_dispatcher_once,
    scripted_env,
    scripted_table,
    subprocess_env,
)
from tests.queues import topology_declare_and_purge

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("broker")]

UNREACHABLE_BROKER = "amqp://guest:guest@127.0.0.1:1//"


@pytest.fixture(scope="class")
def worker(django_db_setup, django_db_blocker):
    """One worker on `default` (scripted handlers) and `sim`, two processes, and no
    dispatcher (each test publishes when it means to), for the tests to which a worker
    already running when their jobs are made makes no difference. Class-scoped: it
    must be gone before the tests after them, whose jobs no other worker may take."""
    with django_db_blocker.unblock():
        topology_declare_and_purge()
        env = scripted_env()
        with celery_worker(queues=["default", "sim"], concurrency=2, env=env, name="dispatch-e2e"):
            yield


class TestWithAWorkerAlreadyRunning:
    """Tests that share one worker (`worker`)."""

    def test_broker_down_create_succeeds_pending_and_runs_once_broker_is_back(
        self, settings, worker
    ):
        broker_url, settings.BROKER_URL = settings.BROKER_URL, UNREACHABLE_BROKER
        job = make_job(job_type="sim", params={"steps": 2, "step_seconds": 0})
        assert Job.objects.get(id=job.id).status == "pending"
        assert job_events(job.id) == ["created"]
        settings.BROKER_URL = broker_url  # the broker is back
        report = run_dispatcher_once(env={"JOBOPS_DISPATCH_PENDING_AFTER_SECONDS": "0"})
        assert report["publish"] == 1
        done = job_finished(job.id)
        assert done.status == "succeeded"
        assert job_events(job.id)[:3] == ["created", "queued", "started"]

    def test_two_dispatchers_racing_publish_each_job_into_one_run(self, settings, worker):
        scripted_table(settings)
        broker_url, settings.BROKER_URL = settings.BROKER_URL, UNREACHABLE_BROKER
        owner = UserFactory()
        jobs = [make_job(owner, job_type="ai", params={"do": "noop"}) for _ in range(30)]
        settings.BROKER_URL = broker_url
        env = subprocess_env(JOBOPS_DISPATCH_PENDING_AFTER_SECONDS="0")
        racers = [
            subprocess.Popen(
                [sys.executable, "manage.py", "run_dispatcher", "--once"],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        published = 0
        for racer in racers:
            out, _ = racer.communicate(timeout=60)
            published += json.loads(out.strip().splitlines()[-1])["publish"]
        assert published == 30  # no row published twice
        for job in jobs:
            assert job_finished(job.id).status == "succeeded"
        for job in jobs:
            assert job_events(job.id).count("started") == 1
            assert len(handlers.runs(job.id)) == 1


def test_queued_job_cancelled_never_runs(settings):
    scripted_table(settings)
    job = make_job(job_type="ai", params={"do": "noop"})
    publish_due_once()  # the dispatcher's step
    assert Job.objects.get(id=job.id).status == "queued"  # confirmed, no worker yet
    job_cancel(job_id=job.id, actor=Actor.system("test"))
    with celery_worker(queues=["default"], env=scripted_env()) as worker:
        wait_for(lambda: "claim_refused" in worker.log_text(), timeout=15)
    assert Job.objects.get(id=job.id).status == "cancelled"
    assert handlers.runs(job.id) == []
    assert "started" not in job_events(job.id)


def test_worker_refuses_a_prefetch_that_could_outlast_the_consumer_timeout():
    args = [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", "sim"]
    worker = Process([*args, "--prefetch-multiplier", "3", "-c", "1"], subprocess_env(), "bad")
    try:
        assert worker.proc.wait(timeout=45) != 0
        assert "refusing to start" in worker.log_text()
    finally:
        worker.stop()


@pytest.fixture
def worker_role():
    """A login role for the worker alone, so the test can take the database away from
    the worker (NOLOGIN + terminate its sessions) while the test keeps its own."""
    role = f"jobops_worker_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {role} LOGIN")
        cursor.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
        cursor.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
    yield role
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role]
        )
        cursor.execute(f"DROP OWNED BY {role}")
        cursor.execute(f"DROP ROLE {role}")


def _database_down_for(role: str, down: bool) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER ROLE {role} {'NOLOGIN' if down else 'LOGIN'}")
        if down:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role]
            )


def test_database_down_while_a_job_fails_decides_nothing(settings, worker_role):
    scripted_table(settings)
    settings.JOBOPS_LOCK_TIMEOUT = 3
    env = {**scripted_env(), "DATABASE_URL": database_url(USER=worker_role, PASSWORD="")}
    with celery_worker(queues=["default"], env=env, name="dbdown") as worker:
        job = make_job(job_type="ai", params={"do": "wait_then", "then": "fatal"})
        publish_due_once()  # the dispatcher's step
        wait_for(lambda: handlers.runs(job.id))
        _database_down_for(worker_role, True)
        handlers.redis_client().set(handlers.key(job.id, "go"), 1)  # now fail (fatal)
        wait_for(lambda: "database_unavailable_requeue" in worker.log_text(), timeout=15)
        # Nothing decided: no dead letter, the job still `running` on attempt 1.
        stuck = Job.objects.get(id=job.id)
        assert (stuck.status, stuck.attempts) == ("running", 1)
        assert not DeadLetter.objects.filter(job_id=job.id).exists()
        _database_down_for(worker_role, False)
        # Back: the stale lock is reclaimed and the job is decided on a real attempt.
        wait_for(lambda: reap_once()["reclaimed"] == 1, timeout=15, interval=0.2)
        assert publish_due_once() == 1  # the dispatcher's step: the retry, due at once
        done = job_finished(job.id)
    assert done.status == "failed" and done.attempts == 2
    assert DeadLetter.objects.get(job_id=job.id).reason == "fatal"
    assert "reclaimed" in job_events(job.id)


def test_a_retry_waiting_for_its_delay_holds_no_slot_and_survives_a_worker_restart(settings):
    scripted_table(settings)
    env = {**scripted_env(), "JOBOPS_BACKOFF_BASE_SECONDS": "4"}  # first delay 2-6 s
    with celery_worker(queues=["default"], env=env, name="before-restart"):
        waiting = make_job(job_type="ai", params={"do": "fail_times", "n": 1})
        publish_due_once()  # the dispatcher's step
        wait_for(lambda: Job.objects.get(id=waiting.id).status == "retrying")
        # One process, prefetch 1: another job runs while the retry waits in the row.
        other = make_job(job_type="ai", params={"do": "noop"})
        assert publish_due_once() == 1  # only `other`: the retry is not due yet
        assert job_finished(other.id, timeout=10).status == "succeeded"
        row = Job.objects.get(id=waiting.id)
        assert row.status == "retrying" and row.next_run_at is not None
    with celery_worker(queues=["default"], env=env, name="after-restart"):
        wait_for(lambda: publish_due_once() == 1, timeout=20, interval=0.2)
        done = job_finished(waiting.id)
    assert done.status == "succeeded" and done.attempts == 2
    assert [r["attempt"] for r in handlers.runs(waiting.id)] == [1, 2]


def published_by_notification(dispatcher: Process, job: Job, *, passes: float) -> None:
    """Wait until `job` is queued; then the dispatcher's loop has still ended only
    `passes` passes (its 30 s interval away), so the publish came from the NOTIFY."""
    wait_for(lambda: Job.objects.get(id=job.id).status == "queued", timeout=10)
    assert dispatcher.metric("dispatcher_passes_total") == passes


def test_a_listening_dispatcher_publishes_a_new_job_at_once_not_at_its_next_loop(settings):
    """docs/architecture.md: creation sends NOTIFY jobs_pending and the dispatcher, LISTENing,
    publishes within milliseconds. Its loop runs every 30 s here: each of several jobs
    is published while the loop has ended no pass after its first (the pass counter
    says so, not the wall clock), so only the notification can explain it."""
    with dispatcher_process(interval=30, name="listening") as dispatcher:
        wait_for(lambda: "dispatcher_listening" in dispatcher.log_text(), timeout=10)
        passes = dispatcher.wait_for_passes(1)  # the first pass, at start, has ended
        assert passes == 1
        for _ in range(3):
            job = make_job(job_type="sim", params={"steps": 1, "step_seconds": 0})
            published_by_notification(dispatcher, job, passes=passes)
    assert "dispatcher_listen_failed" not in dispatcher.log_text()


def test_a_publisher_publishes_at_once_and_leaves_the_rest_to_the_maintaining_loop(settings):
    """`run_dispatcher --role publish` answers NOTIFY alone (a job waits behind no
    relay batch) and beats as a publisher; the reaper is not its work. `--role
    maintain` never LISTENs, yet publishes on its clock and reaps."""
    stale = job_in_state("running", worker="gone")
    backdate(stale, locked_at=3600)
    with dispatcher_process(interval=30, role="publish", name="publisher") as publisher:
        wait_for(lambda: "dispatcher_listening" in publisher.log_text(), timeout=10)
        passes = publisher.wait_for_passes(1)
        assert passes == 1
        job = make_job(job_type="sim", params={"steps": 1, "step_seconds": 0})
        published_by_notification(publisher, job, passes=passes)
        beating = {kind: [p["pid"] for p in found] for kind, found in live_processes().items()}
        assert publisher.pid in beating["publisher"]
        assert publisher.pid not in beating.get("dispatcher", [])
        # A whole pass of its loop has ended (every step of its role ran in it), and no
        # run of the reap step: the reaper is not its work.
        publisher.wait_for_passes(1)
        assert publisher.metric("dispatcher_step_runs_total", step="reap") == 0
        assert "reclaimed" not in job_events(stale.id)
    with dispatcher_process(interval=0.2, role="maintain", name="maintainer") as maintainer:
        later = make_job(job_type="sim", params={"steps": 1, "step_seconds": 0})
        wait_for(lambda: Job.objects.get(id=later.id).status == "queued", timeout=5)
        wait_for(lambda: "reclaimed" in job_events(stale.id), timeout=5)
        assert "dispatcher_listening" not in maintainer.log_text()
