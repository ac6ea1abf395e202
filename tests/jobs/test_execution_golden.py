"""Golden tests of a whole run under each executor: what a job's run writes (claim,
progress, the end and its dead letter) from the start commit of issue 38 (c940624),
byte for byte apart from timestamps and ids (tests/jobs/golden.py, tests/golden/).

The Celery path is `job_execute` (what the task runs), the PostgreSQL executor's is
`jobs_claim`, `run_claimed` and `jobs_finish` (what a run_worker host does with a
window of one job), both in this process with handlers of this module. One execution
core must write for each outcome what these files say.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery.exceptions import Reject

from audit.services import Actor
from audit.verification import audit_verify
from jobs.domain.errors import FatalError, TransientExternalError
from jobs.domain.states import Status
from jobs.models import Job
from jobs.processes.executor import run_claimed
from jobs.processes.runtime import job_execute
from jobs.services import Finish, job_cancel, jobs_claim, jobs_finish
from jobs.services.connectors import breakers_forget
from tests.factories import UserFactory, job_in_state
from tests.jobs.golden import capture, check
from tests.processes import scripted_table

pytestmark = pytest.mark.django_db

HOST = "golden-host"


def succeeds(ctx: Any, params: Any) -> dict[str, Any]:
    ctx.progress(40, step="half")  # written at once: the first value
    ctx.progress(70, step="most", message="nearly é")  # coalesced: flushed with the end
    return {"rows": 2, "name": "ünïcode"}


def fails_transiently(ctx: Any, params: Any) -> None:
    ctx.progress(30, step="a")
    raise RuntimeError("the upstream hung up")


def fails_fatally(ctx: Any, params: Any) -> None:
    ctx.progress(20, step="b")
    raise FatalError("planned fatal error", code="PLANNED_FATAL")


def is_cancelled(ctx: Any, params: Any) -> None:
    ctx.progress(10, step="c")
    job_cancel(job_id=ctx.job_id, actor=Actor.system("golden-canceller"))
    ctx.check_cancel()


def erp_fails(ctx: Any, params: Any) -> None:
    raise TransientExternalError("the ERP answered 503", code="ERP_503")


HANDLERS = {
    "succeeded": succeeds,
    "retrying": fails_transiently,
    "failed": fails_fatally,
    "cancelled": is_cancelled,
}


@pytest.fixture
def owner(settings: Any) -> Any:
    # Deterministic ends: progress coalesced until the final write, a cancel seen at
    # once, no random backoff (the retry is due at once).
    settings.JOBOPS_PROGRESS_INTERVAL_SECONDS = 3600
    settings.JOBOPS_CANCEL_CHECK_SECONDS = 0
    settings.JOBOPS_BACKOFF_BASE_SECONDS = 0
    return UserFactory(username="golden-owner")


def cam_job(settings: Any, owner: Any, outcome: str, status: str) -> Job:
    handler = HANDLERS[outcome]
    scripted_table(settings, cam={"handler": f"{__name__}.{handler.__name__}"})
    return job_in_state(status, owner=owner, job_type="cam", params={"do": handler.__name__})


@pytest.mark.parametrize("outcome", list(HANDLERS))
def test_a_celery_run(settings, owner, outcome):
    job = cam_job(settings, owner, outcome, Status.QUEUED)
    with capture() as taken:
        try:
            summary = job_execute(payload={"job_id": str(job.id)}, hostname=HOST)
        except Reject as rejected:  # a dead letter: the broker copy goes to the DLQ
            assert outcome == "failed" and rejected.requeue is False
        else:
            assert summary["outcome"] == outcome
    assert Job.objects.get(id=job.id).status == outcome
    check(f"run_celery_{outcome}", taken)
    assert audit_verify(job_ids=[job.id]).ok


@pytest.mark.parametrize("outcome", list(HANDLERS))
def test_a_postgres_executor_run(settings, owner, outcome):
    job = cam_job(settings, owner, outcome, Status.PENDING)
    with capture() as taken:
        [claimed] = jobs_claim(queues=[job.queue], locked_by=HOST, limit=5)
        finish = run_claimed(claimed, HOST, process=False)
        assert isinstance(finish, Finish) and finish.target == outcome
        assert jobs_finish(finishes=[finish], locked_by=HOST) == []
    assert Job.objects.get(id=job.id).status == outcome
    check(f"run_postgres_{outcome}", taken)
    assert audit_verify(job_ids=[job.id]).ok


# --- a connector's failures: the breaker counts them and holds its jobs ----------------------


@pytest.fixture
def erp_breaker(settings: Any) -> Any:
    """The erp connector's breaker opens at its first failure (no jitter: the held
    job's wait is the cool-down); its jobs run `erp_fails` in this process."""
    settings.JOBOPS_CONNECTORS = {
        "erp": {
            "failures": 1,
            "cooldown_seconds": 60.0,
            "probe_wait_seconds": 5.0,
            "jitter_seconds": 0.0,
        }
    }
    settings.JOBOPS_CONNECTOR_CACHE_SECONDS = 0
    scripted_table(settings, erp={"handler": f"{__name__}.erp_fails"})
    breakers_forget()
    yield
    breakers_forget()


def erp_job(owner: Any, status: str) -> Job:
    return job_in_state(status, owner=owner, job_type="erp", params={"event": "invoice.paid"})


@pytest.mark.parametrize("last_attempt", [False, True], ids=["attempts_left", "last_attempt"])
def test_a_celery_run_whose_connector_failure_opens_its_breaker(
    settings, owner, erp_breaker, last_attempt
):
    if last_attempt:  # held for the probe instead of dead-lettered: one more attempt
        settings.JOB_TYPES["erp"]["max_retries"] = 0
    job = erp_job(owner, Status.QUEUED)
    with capture() as taken:
        assert job_execute(payload={"job_id": str(job.id)}, hostname=HOST)["outcome"] == (
            "retrying"
        )
    check(f"run_celery_breaker_{'last' if last_attempt else 'left'}", taken)
    assert audit_verify(job_ids=[job.id]).ok


def test_a_postgres_executor_window_with_two_failures_of_one_connector(
    settings, owner, erp_breaker
):
    settings.JOBOPS_CONNECTORS = {"erp": {**settings.JOBOPS_CONNECTORS["erp"], "failures": 3}}
    jobs = [erp_job(owner, Status.PENDING) for _ in range(2)]
    with capture() as taken:
        claimed = jobs_claim(queues=["erp"], locked_by=HOST, limit=5)
        finishes = [run_claimed(job, HOST, process=False) for job in claimed]
        assert all(isinstance(f, Finish) and f.target == "retrying" for f in finishes)
        assert jobs_finish(finishes=finishes, locked_by=HOST) == []
    check("run_postgres_two_connector_failures", taken)
    assert audit_verify(job_ids=[job.id for job in jobs]).ok
