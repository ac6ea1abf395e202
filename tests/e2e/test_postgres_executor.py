"""The postgres executor end to end (docs/postgres-executor.md): a real `run_worker` and a
real dispatcher, with `sim`, `model` and `cam` configured JOBOPS_EXECUTOR_<QUEUE>=postgres.
Jobs run with progress, cancellation, retries and dead letters without the broker;
a replay runs the job again; a run_worker killed mid-job has its job reclaimed by the
reaper and run once more."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest

from audit.services import Actor
from dlq.services.replay import dead_letters_replay
from jobs.models import DeadLetter, Job
from jobs.services.cancellation import job_cancel
from tests import handlers
from tests.factories import OperatorFactory, make_job
from tests.polling import wait_for
from tests.processes import (
    assert_chain_valid,
    dispatcher_process,
    run_manage,
    run_worker_process,
    scripted_env,
    scripted_table,
    subprocess_env,
)
from tests.processes import job_events as events
from tests.processes import job_finished as finished

pytestmark = [pytest.mark.django_db(transaction=True)]

POSTGRES_QUEUES = ("sim", "model", "cam")
EXECUTORS = {f"JOBOPS_EXECUTOR_{q.upper()}": "postgres" for q in POSTGRES_QUEUES}
TABLE = {"model": {"max_retries": 2}, "cam": {"max_retries": 2}}


def _env() -> dict[str, str]:
    return {**scripted_env(**TABLE), **EXECUTORS}


@pytest.fixture(scope="module")
def executor(django_db_setup, django_db_blocker):
    """One run_worker on sim and model, and one dispatcher (the reaper, scheduled jobs,
    the outbox), shared by the module's tests; `cam` is left to the tests' own hosts."""
    with django_db_blocker.unblock():
        with (
            run_worker_process(queues=["sim", "model"], env=_env(), name="pg-shared") as worker,
            dispatcher_process(interval=0.2, env=_env(), name="pg-dispatcher") as dispatcher,
        ):
            yield worker, dispatcher


@pytest.fixture(autouse=True)
def postgres_queues(settings, executor):
    scripted_table(settings, **TABLE)
    settings.JOBOPS_QUEUE_EXECUTORS = {
        **settings.JOBOPS_QUEUE_EXECUTORS,
        **dict.fromkeys(POSTGRES_QUEUES, "postgres"),
    }
    return executor


def test_a_sim_job_runs_with_progress_without_the_broker():
    job = make_job(job_type="sim", params={"steps": 4, "step_seconds": 0.15, "seed": 3})
    done = finished(job.id, timeout=30)
    assert (done.status, done.attempts, done.progress_percent) == ("succeeded", 1, 100)
    assert done.result["steps"] == 4
    trail = events(job.id)
    assert trail[:2] == ["created", "started"] and trail[-1] == "succeeded"
    assert "queued" not in trail  # never published
    assert "progress" in trail
    assert_chain_valid(job.id)


def test_a_running_job_is_cancelled_at_its_next_check():
    job = make_job(job_type="model", params={"do": "steps", "steps": 40, "step_seconds": 0.1})
    step = handlers.key(job.id, "step")
    wait_for(lambda: int(handlers.redis_client().get(step) or 0) >= 2, timeout=20)
    job_cancel(job_id=job.id, actor=Actor.system("test"))
    done = finished(job.id, timeout=20)
    assert done.status == "cancelled"
    assert int(handlers.redis_client().get(step)) < 40
    # The handler writes progress until its next cancel check sees the request (at most
    # JOBOPS_CANCEL_CHECK_SECONDS later): a progress entry may land after the request.
    trail = events(job.id)
    after_request = trail[trail.index("cancel_requested") + 1 :]
    assert after_request[-1] == "cancelled" and set(after_request[:-1]) <= {"progress"}, trail
    assert_chain_valid(job.id)


def test_retries_end_in_a_dead_letter_that_a_replay_runs_again():
    job = make_job(job_type="model", params={"do": "fail_times", "n": 3})
    failed = finished(job.id, timeout=30)
    assert (failed.status, failed.attempts, failed.last_error_code) == ("failed", 3, "PLANNED")
    assert events(job.id).count("retrying") == 2
    [row] = DeadLetter.objects.filter(job_id=job.id)
    assert (row.queue, row.reason, row.broker_copy) == ("model_dlq", "exhausted", False)

    result = dead_letters_replay(
        actor_user=OperatorFactory(), justification="INC-7: fixed", job_ids=[job.id]
    )
    assert result.matched == 1
    done = finished(job.id, timeout=30)  # run_worker took it on the replay's NOTIFY
    assert (done.status, done.attempts, done.result) == ("succeeded", 4, {"ok": True, "attempt": 4})
    assert "dlq_replayed" in events(job.id)
    assert_chain_valid(job.id)
    check = run_manage("verify_audit_chain", "--job", str(job.id), env=subprocess_env())
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_job_of_a_killed_run_worker_is_reclaimed_and_runs_once_more():
    with run_worker_process(queues=["cam"], env=_env(), name="pg-doomed") as doomed:
        job = make_job(job_type="cam", params={"do": "steps", "steps": 10, "step_seconds": 0.2})
        step = handlers.key(job.id, "step")
        wait_for(lambda: int(handlers.redis_client().get(step) or 0) >= 2, timeout=20)
        doomed.kill(signal.SIGKILL)  # the host and its runners, mid-job
        doomed.proc.wait(timeout=10)
    assert Job.objects.get(id=job.id).status == "running"
    with run_worker_process(queues=["cam"], env=_env(), name="pg-rescuer"):
        done = finished(job.id, timeout=40)
    assert (done.status, done.attempts) == ("succeeded", 2)
    trail = events(job.id)
    assert trail.count("succeeded") == 1 and trail.index("reclaimed") < trail.index("succeeded")
    assert handlers.overlaps(job.id) == 0
    assert [r["attempt"] for r in handlers.runs(job.id)] == [1, 2]
    assert_chain_valid(job.id)


def test_a_handler_catches_its_soft_time_limit_as_it_does_under_celery():
    """A run_worker child raises the class the adapter hands the execution core,
    celery.exceptions.SoftTimeLimitExceeded, at the type's soft limit: the handler that
    catches it under Celery (tests/e2e/test_execution_limits.py) catches it here too."""
    cam = {**TABLE["cam"], "soft_time_limit": 1, "time_limit": 6}
    env = {**scripted_env(model=TABLE["model"], cam=cam), **EXECUTORS}
    with run_worker_process(queues=["cam"], env=env, name="pg-soft-limit"):
        job = make_job(job_type="cam", params={"do": "catch_soft_limit", "seconds": 30})
        done = finished(job.id, timeout=30)
    assert (done.status, done.attempts, done.result) == ("succeeded", 1, {"caught": True})
    assert handlers.soft_limit_caught(job.id) == "SoftTimeLimitExceeded"
    assert_chain_valid(job.id)


def _group_alive(pgid: int) -> set[int]:
    """The processes of process group `pgid` that are alive (not zombies): read from
    /proc, as a run_worker's pool children stay in its group after it dies."""
    alive = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # Field 3 is the state, field 5 the process group; the name in field 2 may
            # hold spaces.
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # a process that ended meanwhile
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            alive.add(int(stat.parent.name))
    return alive


# kill -9 of the main process with its children left: `heavy`
# (docs/development.md#the-test-budget); make test keeps the killed run_worker whose job
# is reclaimed and runs once more (above).
@pytest.mark.heavy
def test_the_pool_children_of_a_killed_run_worker_end_and_its_job_runs_once():
    """kill -9 of run_worker's main process alone (not its group): its pool children, one
    of them blocked in a handler, end within seconds; the job is reclaimed and its
    handler's effect happens once."""
    counter = f"jobops-test:orphans:{uuid.uuid4().hex}"
    with run_worker_process(queues=["cam"], env=_env(), name="pg-orphaned") as doomed:
        job = make_job(
            job_type="cam", params={"do": "wait_then", "then": "count", "counter": counter}
        )
        wait_for(lambda: handlers.runs(job.id), timeout=20)  # its handler blocks
        children = _group_alive(doomed.pid) - {doomed.pid}
        assert len(children) == 2, children  # --concurrency 2, the processes pool
        os.kill(doomed.pid, signal.SIGKILL)  # the main process only
        doomed.proc.wait(timeout=10)
        wait_for(
            lambda: not (_group_alive(doomed.pid) & children),
            timeout=5,
            what="the killed run_worker's pool children to end",
        )
    assert Job.objects.get(id=job.id).status == "running"
    handlers.redis_client().set(handlers.key(job.id, "go"), 1)  # a survivor would count too
    with run_worker_process(queues=["cam"], env=_env(), name="pg-adopter"):
        done = finished(job.id, timeout=40)
    assert (done.status, done.attempts) == ("succeeded", 2)
    assert handlers.redis_client().hgetall(counter) == {str(job.id): "1"}
    assert [r["attempt"] for r in handlers.runs(job.id)] == [1, 2]
    trail = events(job.id)
    assert trail.count("succeeded") == 1 and trail.index("reclaimed") < trail.index("succeeded")
    assert_chain_valid(job.id)
