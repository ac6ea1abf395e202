"""A dead-lettered job replayed end to end: real worker, dispatcher, RabbitMQ, PostgreSQL."""

from __future__ import annotations

import pytest

from audit.models import AuditLog
from audit.verification import audit_verify
from dlq.broker import dlq_depths, dlq_peek
from dlq.services.replay import dead_letters_replay
from jobs.models import DeadLetter, Job
from tests import handlers
from tests.factories import OperatorFactory, make_job
from tests.polling import wait_for
from tests.processes import (
    FAST_ENV,
    celery_worker,
    dispatcher_process,
    scripted_env,
    scripted_table,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("broker")]

# No retries for `ai` here: the first failure dead-letters the job at once.
NO_RETRIES = {"ai": {"max_retries": 0}}


def test_a_dead_lettered_job_replayed_runs_again_and_succeeds(settings):
    scripted_table(settings, **NO_RETRIES)
    settings.JOBOPS_LOCK_TIMEOUT = int(FAST_ENV["JOBOPS_LOCK_TIMEOUT"])
    env = scripted_env(**NO_RETRIES)
    with (
        celery_worker(queues=["default"], env=env, name="dlq-e2e") as worker,
        dispatcher_process(interval=0.2, env=env, name="dlq-e2e-dispatcher"),
    ):
        # Fails on attempt 1 (retryable, but no retries left), succeeds from attempt 2 on.
        job = make_job(job_type="ai", params={"do": "fail_times", "n": 1})
        row = wait_for(
            lambda: DeadLetter.objects.filter(job_id=job.id, broker_copy=True).first(),
            timeout=30,
        )
        failed = Job.objects.get(id=job.id)
        assert (failed.status, failed.attempts, failed.max_attempts) == ("failed", 1, 1)
        assert failed.dead_letter_queue == "default_dlq"
        assert (row.state, row.reason, row.error_code) == ("open", "exhausted", "PLANNED")
        # The broker copy is in the DLQ too (Celery did not ack the failure away).
        assert [m.job_id for m in dlq_peek(queue="default_dlq", limit=5)] == [str(job.id)]

        result = dead_letters_replay(
            actor_user=OperatorFactory(), justification="upstream fixed", queue="default_dlq"
        )
        assert result.resolved == [row.id] and result.broker_acked == 1

        done = wait_for(
            lambda: (j := Job.objects.get(id=job.id)).status in ("succeeded", "failed") and j,
            timeout=30,
        )
        assert done.status == "succeeded", worker.log_text()[-3000:]
    assert (done.attempts, done.max_attempts) == (2, 2)
    assert done.last_error_code is None and done.dead_letter_queue is None
    assert [r["attempt"] for r in handlers.runs(job.id)] == [1, 2]
    trail = list(
        AuditLog.objects.filter(job_id=job.id).order_by("seq").values_list("event_type", flat=True)
    )
    replayed_at = trail.index("dlq_replayed")
    assert trail[replayed_at - 2 : replayed_at] == ["failed", "dead_lettered"]
    assert trail[-1] == "succeeded" and "started" in trail[replayed_at:]
    assert DeadLetter.objects.get(id=row.id).state == "replayed"
    assert dlq_depths(queues=["default_dlq"]) == {"default_dlq": 0}
    assert audit_verify(job_ids=[job.id]).ok
