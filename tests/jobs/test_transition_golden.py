"""Golden tests: each kind of change a job goes through writes, byte for byte apart from
timestamps and ids, the audit entries, outbox events and row changes the start commit
of issue 38 (c940624) wrote (tests/golden/, recorded there with RECORD_GOLDEN=1).

The portal's timeline, the verifier's cross-check and event consumers read these
shapes, so a rewrite of the transition core must keep them. Every case drives its
change through the public services (never through the transition statement itself), so
that the cases outlive the statement; what is normalised is said in tests/jobs/golden.py.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from audit.services import Actor
from audit.verification import audit_verify
from dlq.broker import DecodedMessage
from dlq.services.cancel import jobs_cancel_by_filter
from dlq.services.fix_forward import fix_forward_approve, fix_forward_request
from dlq.services.reconcile import dead_letter_reconcile, dead_letters_reconcile
from dlq.services.replay import dead_letters_discard, dead_letters_replay
from jobs.domain.states import Status
from jobs.models import DeadLetter, Job
from jobs.selectors import JobFilter
from jobs.services import (
    WORKER,
    Finish,
    HoldReason,
    job_cancel,
    job_cancel_confirm,
    job_claim,
    job_create,
    job_fail_with_dead_letter,
    job_heartbeat,
    job_hold,
    job_progress_write,
    job_publish,
    job_rerun,
    job_retry,
    job_retry_for_user,
    job_succeed,
    jobs_claim,
    jobs_finish,
    reap_once,
)
from jobs.services.connectors import breakers_forget, connector_gate, connector_open
from jobs.services.publishing import publish_due_once
from jobs.services.purge import purge_run
from jobs.services.queues import queue_pause
from jobs.services.scheduling import promote_due_jobs
from tenants.services import organisation_suspend
from tests.factories import (
    OperatorFactory,
    UserFactory,
    backdate,
    dead_letter_without_job,
    default_org,
    fence_of,
    job_in_state,
)
from tests.jobs.golden import capture, check

pytestmark = pytest.mark.django_db

OPERATOR = Actor.system("golden-operator")
PARAMS = {"steps": 2, "step_seconds": 0}
PROGRESS = {"percent": 70, "step": "étape 2", "message": "two of three \u00e9"}


@pytest.fixture
def owner() -> Any:
    return UserFactory(username="golden-owner")


@pytest.fixture
def operator() -> Any:
    return OperatorFactory(username="golden-operator")


def state(status: str, owner: Any, **kwargs: Any) -> Job:
    return job_in_state(status, owner=owner, **kwargs)


def verified(*jobs: Job) -> None:
    report = audit_verify(job_ids=[job.id for job in jobs])
    assert report.ok, report


# --- creation and dispatch ------------------------------------------------------------------


def test_create(owner):
    with capture() as taken:
        job, created = job_create(
            owner=owner,
            job_type="sim",
            params={"steps": 3, "step_seconds": 0.25, "seed": 2**40 + 1},
            idempotency_key="golden-key",
            correlation_id="golden-correlation",
            priority=7,
        )
    assert created
    check("create", taken)
    verified(job)


def test_create_scheduled(owner):
    with capture() as taken:
        job, _ = job_create(
            owner=owner, job_type="sim", params=PARAMS, run_at=timezone.now() + timedelta(hours=1)
        )
    assert job.status == Status.SCHEDULED
    check("create_scheduled", taken)


def test_scheduled_job_due(owner):
    job = state(Status.SCHEDULED, owner)
    with capture() as taken:
        assert promote_due_jobs(now=timezone.now() + timedelta(hours=2)) == 1
    check("scheduled_due", taken)
    verified(job)


def test_publish_pending_to_queued(owner, broker):
    job = state(Status.PENDING, owner)
    with capture() as taken:
        assert job_publish(job_id=job.id)
    check("publish", taken)
    verified(job)


def test_dispatcher_publishes_a_batch(owner, broker):
    pending = [state(Status.PENDING, owner) for _ in range(2)]
    for job in pending:
        backdate(job, created_at=60)
    retrying = state(Status.RETRYING, owner, retry_in=0)
    with capture() as taken:
        assert publish_due_once(pending_after=0) == 3
    check("publish_batch", taken)
    verified(*pending, retrying)


# --- a worker's run -------------------------------------------------------------------------


def test_claim(owner):
    job = state(Status.QUEUED, owner)
    with capture() as taken:
        assert job_claim(job_id=job.id, locked_by="golden-worker") is not None
    check("claim", taken)
    verified(job)


def test_claim_refused_queue_paused(owner):
    job = state(Status.QUEUED, owner)
    queue_pause(queue="sim", reason="golden pause", actor=OPERATOR)
    with capture() as taken:
        assert job_claim(job_id=job.id, locked_by="golden-worker") is None
    check("claim_refused_queue_paused", taken)


def test_claim_refused_org_suspended(owner):
    job = state(Status.QUEUED, owner)
    organisation_suspend(org=default_org(), actor=OPERATOR)
    with capture() as taken:
        assert job_claim(job_id=job.id, locked_by="golden-worker") is None
    check("claim_refused_org_suspended", taken)


def test_hold_org_suspended(owner):
    job = state(Status.QUEUED, owner)
    organisation_suspend(org=default_org(), actor=OPERATOR)
    with capture() as taken:
        assert job_hold(job_id=job.id, reason=HoldReason.ORG_SUSPENDED, actor=WORKER) is not None
    check("hold_org_suspended", taken)
    verified(job)


def test_hold_queue_paused(owner):
    job = state(Status.QUEUED, owner)
    queue_pause(queue="sim", reason="golden pause", actor=OPERATOR)
    with capture() as taken:
        assert job_hold(job_id=job.id, reason=HoldReason.QUEUE_PAUSED, actor=WORKER) is not None
    check("hold_queue_paused", taken)
    verified(job)


def test_heartbeat(owner):
    job = state(Status.RUNNING, owner)
    with capture() as taken:
        assert job_heartbeat(job_id=job.id, fence=fence_of(job)) is False
    check("heartbeat", taken)


def test_progress(owner):
    job = state(Status.RUNNING, owner)
    with capture() as taken:
        job_progress_write(job_id=job.id, fence=fence_of(job), **PROGRESS)
    check("progress", taken)
    verified(job)


def test_succeed(owner):
    job = state(Status.RUNNING, owner)
    with capture() as taken:
        job_succeed(
            job_id=job.id,
            fence=fence_of(job),
            result={"rows": 3, "name": "Ünïcode \u2603", "big": 2**40, "nested": {"b": [1, {}]}},
            progress=PROGRESS,
        )
    check("succeed", taken)
    verified(job)


def test_retry(owner):
    job = state(Status.RUNNING, owner)
    with capture() as taken:
        job_retry(
            job_id=job.id,
            fence=fence_of(job),
            delay=30.25,
            error_code="TEMPORARY",
            error_message='the upstream said "later"\n(503)',
            progress=PROGRESS,
        )
    check("retry", taken)
    verified(job)


def test_fail_into_a_dead_letter(owner):
    job = state(Status.RUNNING, owner)
    with capture() as taken:
        job_fail_with_dead_letter(
            job_id=job.id,
            reason="fatal",
            actor=WORKER,
            error_code="BAD_INPUT",
            error_message="the input was bad",
            fence=fence_of(job),
        )
    check("fail_dead_letter", taken)
    verified(job)


def test_finish_failed_flushes_progress_then_dead_letters(owner):
    job = state(Status.RUNNING, owner)
    finish = Finish(
        job_id=job.id,
        attempt=1,
        target=Status.FAILED,
        error_code="EXHAUSTED",
        error_message="no more attempts",
        reason="exhausted",
        progress=PROGRESS,
        job_type="sim",
    )
    fence = fence_of(job)
    with capture() as taken:  # the completer's batch of one, as a Celery delivery writes it
        assert jobs_finish(finishes=[finish], locked_by=fence.locked_by) == []
    check("finish_failed", taken)
    verified(job)


# --- cancellation ---------------------------------------------------------------------------


def test_cancel_request_of_a_running_job(owner):
    job = state(Status.RUNNING, owner)
    with capture() as taken:
        job_cancel(job_id=job.id, actor=Actor.user(owner))
    check("cancel_request", taken)
    verified(job)


def test_cancel_confirm_by_the_worker(owner):
    job = state(Status.RUNNING, owner)
    job_cancel(job_id=job.id, actor=Actor.user(owner))
    with capture() as taken:
        job_cancel_confirm(job_id=job.id, fence=fence_of(job), progress=PROGRESS)
    check("cancel_confirm", taken)
    verified(job)


def test_cancel_of_a_pending_job(owner):
    job = state(Status.PENDING, owner)
    with capture() as taken:
        job_cancel(job_id=job.id, actor=Actor.user(owner))
    check("cancel_pending", taken)
    verified(job)


def test_cancel_of_a_scheduled_job(owner, operator):
    job = state(Status.SCHEDULED, owner)
    with capture() as taken:
        job_cancel(job_id=job.id, actor=Actor.operator(operator))
    check("cancel_scheduled", taken)
    verified(job)


# --- the reaper and the connector breaker ---------------------------------------------------


def test_reaper_reclaims_a_lost_run(owner):
    job = state(Status.RUNNING, owner)
    backdate(job, locked_at=3600)
    with capture() as taken:
        assert reap_once() == {"reclaimed": 1, "worker_lost": 0}
    check("reclaim", taken)
    verified(job)


def test_reaper_dead_letters_a_lost_last_attempt(owner, settings):
    table = {name: dict(spec) for name, spec in settings.JOB_TYPES.items()}
    table["sim"]["max_retries"] = 0
    settings.JOB_TYPES = table
    job = state(Status.RUNNING, owner)
    assert job.max_attempts == 1
    backdate(job, locked_at=3600)
    with capture() as taken:
        assert reap_once() == {"reclaimed": 0, "worker_lost": 1}
    check("reaper_worker_lost", taken)
    verified(job)


@pytest.fixture
def erp_breaker(settings):
    settings.JOBOPS_CONNECTORS = {
        "erp": {
            "failures": 3,
            "cooldown_seconds": 60.0,
            "probe_wait_seconds": 5.0,
            "jitter_seconds": 0.0,
        }
    }
    settings.JOBOPS_CONNECTOR_CACHE_SECONDS = 0
    breakers_forget()
    yield
    breakers_forget()


def test_defer_by_an_open_connector_breaker(owner, erp_breaker):
    connector_open(name="erp", reason="golden outage", actor=OPERATOR)
    job = state(Status.RUNNING, owner, job_type="erp", params={"event": "invoice.paid"})
    with capture() as taken:
        gate = connector_gate(job=job, fence=fence_of(job))
    assert gate.deferred is not None and gate.delay == 60.0
    check("defer_connector_open", taken)
    verified(job)


def broker_message(job: Job, attempt: int) -> DecodedMessage:
    """What the dead-letter watcher reads of a job's message the broker dead-lettered."""
    return DecodedMessage(
        message_id=f"golden-message-{attempt}",
        job_id=str(job.id),
        task="jobs.run",
        attempt=attempt,
        queue=job.queue,
        reason="delivery_limit",
        x_death=[{"queue": job.queue, "reason": "delivery_limit", "count": 1}],
        headers={"x-delivery-count": 5},
    )


def test_watcher_fails_a_queued_job_the_broker_dead_lettered(owner):
    job = state(Status.QUEUED, owner)
    with capture() as taken:
        assert dead_letter_reconcile(message=broker_message(job, attempt=1)) == "failed"
    check("watcher_failed", taken)
    verified(job)


def test_watcher_records_the_broker_copy_of_a_worker_dead_letter(owner):
    job = state(Status.FAILED, owner, error_code="BOOM", error_message="boom")
    with capture() as taken:
        assert dead_letter_reconcile(message=broker_message(job, attempt=1)) == "broker_copy"
    check("watcher_broker_copy", taken)
    verified(job)


# --- back in line: replay, owner retry, re-run, fix-forward; discard -------------------------


def test_replay_of_a_dead_letter(owner, operator, broker):
    job = state(Status.FAILED, owner, error_code="BOOM", error_message="boom")
    with capture() as taken:
        result = dead_letters_replay(
            actor_user=operator, justification="golden replay (INC-1)", job_ids=[job.id]
        )
    assert result.job_ids == [str(job.id)]
    check("dlq_replay", taken)
    verified(job)


def test_owner_retry_of_a_failed_job(owner):
    job = state(Status.FAILED, owner, error_code="BOOM", error_message="boom")
    with capture() as taken:
        job_retry_for_user(job_id=job.id, user=owner, reason="try once more")
    check("owner_retry", taken)
    verified(job)


def test_rerun_of_a_finished_job(owner, operator):
    job = state(Status.SUCCEEDED, owner, result={"ok": True})
    with capture() as taken:
        new = job_rerun(job_id=job.id, actor_user=operator, justification="golden re-run")
    check("rerun", taken)
    verified(job, new)


def test_fix_forward_applied(owner, operator):
    job = state(Status.FAILED, owner, error_code="BAD_INPUT", error_message="bad input")
    row = DeadLetter.objects.get(job=job)
    with capture() as taken:
        edit = fix_forward_request(
            dead_letter_id=row.id,
            actor_user=operator,
            params={"steps": 7, "step_seconds": 0},
            reason="golden typo",
        )
    assert edit.state == "applied"
    check("fix_forward", taken)
    verified(job)


def test_fix_forward_with_approval(owner, operator, settings):
    settings.JOBOPS_REPLAY_APPROVAL = True
    approver = OperatorFactory(username="golden-approver")
    job = state(Status.FAILED, owner, error_code="BAD_INPUT", error_message="bad input")
    row = DeadLetter.objects.get(job=job)
    with capture() as requested:
        edit = fix_forward_request(
            dead_letter_id=row.id,
            actor_user=operator,
            params={"steps": 7, "step_seconds": 0},
            reason="golden typo",
        )
    assert edit.state == "requested"
    check("fix_forward_requested", requested)
    with capture() as approved:
        assert fix_forward_approve(edit_id=edit.id, actor_user=approver).state == "applied"
    check("fix_forward_approved", approved)
    verified(job)


def test_operator_cancels_by_filter(owner, operator):
    jobs = [state(status, owner) for status in (Status.PENDING, Status.RUNNING, Status.RETRYING)]
    with capture() as taken:
        done = jobs_cancel_by_filter(
            actor_user=operator, filters=JobFilter(type="sim"), justification="golden incident"
        )
    assert (done.cancelled, done.cancel_requested) == (2, 1)  # the running one: asked
    check("cancel_by_filter", taken)
    verified(*jobs)


def test_dlq_discard_of_a_row_without_a_job(operator, broker):
    dead_letter_without_job()
    with capture() as taken:
        result = dead_letters_discard(
            actor_user=operator, justification="golden discard", queue="sim_dlq"
        )
    assert len(result.resolved) == 1
    check("dlq_discard_without_job", taken)


def test_watcher_batch(owner):
    """A burst of broker-made dead letters, reconciled in a few statements."""
    jobs = [state(status, owner) for status in (Status.PENDING, Status.QUEUED, Status.RETRYING)]
    messages = [
        dataclasses.replace(broker_message(job, job.attempts + 1), message_id=f"golden-batch-{n}")
        for n, job in enumerate(jobs)
    ]
    with capture() as taken:
        assert dead_letters_reconcile(messages=messages) == ["failed"] * 3
    check("watcher_batch", taken)
    verified(*jobs)


def test_dlq_discard(owner, operator, broker):
    job = state(Status.FAILED, owner, error_code="BOOM", error_message="boom")
    with capture() as taken:
        result = dead_letters_discard(
            actor_user=operator, justification="golden discard", job_ids=[job.id]
        )
    assert result.job_ids == [str(job.id)]
    check("dlq_discard", taken)
    verified(job)


# --- retention ------------------------------------------------------------------------------


def test_purge_closes_the_chain(owner):
    job = state(Status.SUCCEEDED, owner, result={"ok": True})
    backdate(job, created_at=120, updated_at=120)
    with capture() as taken:
        removed, _more = purge_run(older_than=timedelta(minutes=1))
    assert sum(removed["jobs"].values()) == 1
    check("purge", taken)


# --- batches of the PostgreSQL executor ------------------------------------------------------


def test_batch_claim(owner):
    jobs = [
        job_create(owner=owner, job_type="sim", params=PARAMS, priority=priority)[0]
        for priority in (3, 7, 5)
    ]
    with capture() as taken:
        claimed = jobs_claim(queues=["sim"], locked_by="golden-host", limit=10)
    assert [job.priority for job in claimed] == [7, 5, 3]
    check("batch_claim", taken)
    verified(*jobs)


def test_batch_finish(owner):
    jobs = [job_create(owner=owner, job_type="sim", params=PARAMS)[0] for _ in range(6)]
    claimed = {job.id: job for job in jobs_claim(queues=["sim"], locked_by="golden-host", limit=10)}
    assert len(claimed) == 6
    a, b, c, d, e, f = (job.id for job in jobs)
    finishes = [
        Finish(job_id=a, attempt=1, target=Status.SUCCEEDED, result={"n": 1}, progress=PROGRESS),
        Finish(job_id=b, attempt=1, target=Status.SUCCEEDED, result=None),
        Finish(
            job_id=c,
            attempt=1,
            target=Status.RETRYING,
            error_code="TEMPORARY",
            error_message="later",
            delay=12.5,
            progress=PROGRESS,
        ),
        Finish(job_id=d, attempt=1, target=Status.CANCELLED, progress=PROGRESS),
        Finish(
            job_id=e,
            attempt=1,
            target=Status.FAILED,
            error_code="BAD_INPUT",
            error_message="bad",
            reason="nonretryable",
        ),
        Finish(
            job_id=f,
            attempt=1,
            target=Status.RETRYING,
            error_code="ERP_503",
            error_message="erp down",
            delay=60.0,
            breaker="open",
            extend_attempts=1,
        ),
        # A finish whose fence no longer holds (another attempt): nothing of it is written.
        Finish(job_id=a, attempt=2, target=Status.SUCCEEDED, result={"n": 2}),
    ]
    with capture() as taken:
        lost = jobs_finish(finishes=finishes[:6], locked_by="golden-host")
    assert lost == []
    check("batch_finish", taken)
    verified(*jobs)
    with capture() as taken:
        assert jobs_finish(finishes=finishes[6:], locked_by="golden-host") == finishes[6:]
    check("batch_finish_lost_fence", taken)
