"""Outcome metrics, each attempt's final log line and the job page's attempts, in process.

Jobs run through job_execute as a worker runs them; every metric is read before and
after from the registry the exporter serves (docs/operations/observability.md#metrics).
The counters move when the transition commits, so the runs go through
django_capture_on_commit_callbacks(execute=True).
"""

from __future__ import annotations

import pytest
import structlog
from celery.exceptions import Reject
from django.db import DatabaseError, connections, transaction
from django.db.models import F

from audit.services import Actor
from core.db import execute_prepared
from jobs.domain.errors import TransientExternalError
from jobs.integrations import metrics
from jobs.models import Job
from jobs.processes.executor import run_claimed
from jobs.processes.runtime import finish_log, job_execute
from jobs.selectors import job_attempts
from jobs.services import job_cancel, job_claim, jobs_claim, jobs_finish, reap_once
from tests.factories import backdate, job_in_state
from tests.metric_samples import Moved
from tests.processes import scripted_table

pytestmark = pytest.mark.django_db

DB = {"alias": "default", "vendor": "postgresql"}
# The job_type and queue labels of a `cam` job (its type runs on the queue `cam`).
CAM = {"job_type": "cam", "queue": "cam"}


# Handlers of a `cam` job, run in this process by job_execute.
def succeeds(ctx, params):
    return {"ok": True}


def fails_on_the_first_attempt(ctx, params):
    if ctx.attempt == 1:
        raise TransientExternalError("the first call fails", code="FLAKY")
    return {"ok": True}


def always_fails(ctx, params):
    raise TransientExternalError("down", code="DEPENDENCY_DOWN")


def is_reclaimed_meanwhile(ctx, params):
    # The reaper reclaimed the job and another worker claimed it while this one ran.
    Job.objects.filter(id=ctx.job_id).update(locked_by="w2", attempts=F("attempts") + 1)
    return {"ok": True}


def raises_a_key_error(ctx, params):
    raise KeyError("surprise")


def queued(settings, handler, **type_options) -> Job:
    """A queued `cam` job whose type runs `handler`."""
    scripted_table(settings, cam={"handler": f"{__name__}.{handler.__name__}", **type_options})
    return job_in_state("queued", job_type="cam", params={"do": handler.__name__})


def run(settings, handler, job=None, **type_options) -> Job:
    """Run a `cam` job by `handler` as a worker does (a new queued one unless `job` is
    given); returns the job as stored."""
    job = job or queued(settings, handler, **type_options)
    try:
        job_execute(payload={"job_id": str(job.id)}, hostname="test-host")
    except Reject:
        pass  # dead-lettered: the broker copy would go to the DLQ
    return Job.objects.get(id=job.id)


def due_now(job: Job, *, seconds_ago: float) -> None:
    """A retrying job whose next_run_at came `seconds_ago`."""
    backdate(job, next_run_at=seconds_ago)


def test_a_succeeded_job_counts_its_outcome_attempts_wait_and_duration(
    settings, django_capture_on_commit_callbacks
):
    moved = Moved()
    job = queued(settings, succeeds)
    backdate(job, created_at=30)
    with django_capture_on_commit_callbacks(execute=True):
        assert run(settings, succeeds, job).status == "succeeded"
    assert moved("jobs_succeeded_total", type="cam", **CAM) == 1
    assert moved("job_finished_total", type="cam", status="succeeded") == 1  # kept
    assert moved("job_attempts_count", type="cam") == 1
    assert moved("job_attempts_sum", type="cam") == 1
    assert moved("job_queue_latency_seconds_count", type="cam") == 1
    assert 30 <= moved("job_queue_latency_seconds_sum", type="cam") < 60  # created -> claim
    assert moved("job_duration_seconds_count", type="cam", status="succeeded") == 1
    assert moved.across("jobs_failed_total", type="cam") == 0
    # The async jobs names move with them (docs/operations/observability.md#metrics).
    assert moved("jobs_started_total", **CAM) == 1
    assert moved("jobs_duration_seconds_count", **CAM) == 1
    assert moved("jobs_attempts_count", **CAM) == 1
    assert moved("jobs_attempts_sum", **CAM) == 1


def test_a_retry_then_a_dead_letter_count_each_attempt_and_the_failure(
    settings, django_capture_on_commit_callbacks, json_log_lines
):
    moved = Moved()
    with django_capture_on_commit_callbacks(execute=True):
        job = run(settings, always_fails, max_retries=1)
    assert (job.status, job.attempts) == ("retrying", 1)
    due_now(job, seconds_ago=20)
    with django_capture_on_commit_callbacks(execute=True):
        job = run(settings, always_fails, job)
    assert (job.status, job.attempts) == ("failed", 2)

    assert moved("retries_total", type="cam", error_code="DEPENDENCY_DOWN") == 1
    failed = {"type": "cam", "error_code": "DEPENDENCY_DOWN", "error_class": "retryable", **CAM}
    assert moved("jobs_failed_total", **failed) == 1
    assert moved("jobs_dead_lettered_total", type="cam", reason="exhausted") == 1
    assert moved.across("jobs_succeeded_total", type="cam") == 0
    assert moved("job_attempts_count", type="cam") == 1  # one job ended,
    assert moved("job_attempts_sum", type="cam") == 2  # after two attempts
    assert moved("job_duration_seconds_count", type="cam", status="retrying") == 1
    assert moved("job_duration_seconds_count", type="cam", status="failed") == 1
    # The async jobs names: two attempts started and timed, one dead letter.
    assert moved("jobs_started_total", **CAM) == 2
    assert moved("jobs_duration_seconds_count", **CAM) == 2
    assert moved("deadletter_total", **CAM) == 1
    assert moved("jobs_attempts_sum", **CAM) == 2
    # The retry waited from its next_run_at, not from the job's creation. (10 ms below
    # 20: the sum of float seconds from two clocks came out 19.999999999999996 once.)
    assert moved("job_queue_latency_seconds_count", type="cam") == 2
    assert 19.99 <= moved("job_queue_latency_seconds_sum", type="cam") < 40

    # Each attempt's final line says how it went.
    lines = {x["event"]: x for x in json_log_lines() if x.get("job_id") == str(job.id)}
    retrying, dead = lines["job_retrying"], lines["job_dead_lettered"]
    assert (retrying["attempt"], retrying["outcome"], retrying["error_code"]) == (
        1,
        "retrying",
        "DEPENDENCY_DOWN",
    )
    assert (dead["attempt"], dead["outcome"], dead["error_code"]) == (
        2,
        "failed",
        "DEPENDENCY_DOWN",
    )
    assert dead["reason"] == "exhausted"
    for line in (retrying, dead):
        assert isinstance(line["duration_ms"], int) and 0 <= line["duration_ms"] < 10_000


def test_a_succeeded_attempt_line_carries_its_duration_and_no_error(settings, json_log_lines):
    job = run(settings, succeeds)
    [line] = [x for x in json_log_lines() if x["event"] == "job_succeeded"]
    assert line["job_id"] == str(job.id)
    assert (line["attempt"], line["outcome"], line["error_code"]) == (1, "succeeded", None)
    assert isinstance(line["duration_ms"], int) and line["duration_ms"] >= 0


def test_a_lost_attempt_line_is_a_warning_and_its_duration_counts_as_lost(settings, json_log_lines):
    moved = Moved()
    run(settings, is_reclaimed_meanwhile)
    [line] = [x for x in json_log_lines() if x["event"] == "job_lost_stopping"]
    assert (line["level"], line["attempt"], line["outcome"]) == ("warning", 1, "lost")
    assert line["error_code"] is None and line["duration_ms"] >= 0
    assert moved("job_duration_seconds_count", type="cam", status="lost") == 1
    assert moved("job_duration_seconds_count", type="cam", status="succeeded") == 0


def test_an_unexpected_exception_counts_under_one_error_code_label(
    settings, django_capture_on_commit_callbacks
):
    moved = Moved()
    with django_capture_on_commit_callbacks(execute=True):
        job = run(settings, raises_a_key_error, max_retries=0)
    assert (job.status, job.last_error_code) == ("failed", "UNEXPECTED_KeyError")
    failed = {"type": "cam", "error_code": "UNEXPECTED", "error_class": "retryable", **CAM}
    assert moved("jobs_failed_total", **failed) == 1
    assert moved.across("jobs_failed_total", error_code="UNEXPECTED_KeyError") == 0


def test_error_code_labels_are_bounded(monkeypatch):
    monkeypatch.setattr(metrics, "_error_codes_seen", set())
    monkeypatch.setattr(metrics, "MAX_ERROR_CODE_LABELS", 2)
    assert metrics.error_code_label(None) == ""
    assert metrics.error_code_label("UNEXPECTED_ValueError") == "UNEXPECTED"
    assert [metrics.error_code_label(c) for c in ("A", "B", "A", "C")] == ["A", "B", "A", "OTHER"]


def test_a_cancel_before_start_observes_zero_attempts(django_capture_on_commit_callbacks):
    moved = Moved()
    job = job_in_state("queued")
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(job_id=job.id, actor=Actor.system("test"))
    assert moved("job_attempts_count", type="sim") == 1
    assert moved("job_attempts_sum", type="sim") == 0
    assert moved("job_attempts_bucket", type="sim", le="0.0") == 1


# --- the database backend's metrics -------------------------------------------------------


def test_orm_and_prepared_statements_are_counted_by_the_database_backend():
    moved = Moved()
    Job.objects.filter(id=None).exists()  # one statement through Django's cursor
    assert moved("django_db_execute_total", **DB) == 1
    execute_prepared("SELECT 1 AS one", {})  # one through core.db's own cursor
    assert moved("django_db_execute_total", **DB) == 2
    assert moved("django_db_query_duration_seconds_count", **DB) == 2
    with pytest.raises(DatabaseError), transaction.atomic():
        execute_prepared("SELECT 1 / 0 AS never", {})
    assert moved("django_db_errors_total", type="DivisionByZero", **DB) == 1
    assert type(connections["default"]).__module__.startswith("django_prometheus.")


# --- the job page's attempts --------------------------------------------------------------


def test_the_attempts_of_a_job_that_retried_then_succeeded(settings, otp_admin_client):
    job = run(settings, fails_on_the_first_attempt)
    assert job.status == "retrying"
    due_now(job, seconds_ago=1)
    job = run(settings, fails_on_the_first_attempt, job)
    assert (job.status, job.attempts) == ("succeeded", 2)

    attempts = job_attempts(job=Job.objects.get(id=job.id))
    assert not attempts.more
    first, second = attempts.rows
    assert (first.number, first.outcome, first.error_code) == (1, "retrying", "FLAKY")
    assert (second.number, second.outcome, second.error_code) == (2, "succeeded", None)
    for attempt in attempts.rows:
        assert attempt.ended is not None and attempt.started <= attempt.ended
        assert attempt.seconds is not None and 0 <= attempt.seconds < 10
    assert first.ended <= second.started

    page = otp_admin_client.get(f"/admin/jobs/job/{job.id}/change/")
    assert page.status_code == 200
    table = page.content.decode().split('id="attempts"')[1].split("</table>")[0]
    assert table.count("<tr>") == 3  # the header and two attempts
    assert "<code>FLAKY</code>" in table and "badge-retrying" in table
    assert "badge-succeeded" in table and "earlier ones" not in table


def test_a_lost_attempt_ends_reclaimed_and_a_running_one_has_no_end(settings):
    settings.JOBOPS_LOCK_TIMEOUT = 60
    job = job_in_state("running", worker="w1")
    backdate(job, locked_at=120)
    assert reap_once()["reclaimed"] == 1
    due_now(job, seconds_ago=0)
    assert job_claim(job_id=job.id, locked_by="w2") is not None
    lost, running = job_attempts(job=Job.objects.get(id=job.id)).rows
    assert (lost.number, lost.outcome, lost.error_code) == (1, "lost", "WORKER_LOST")
    assert (running.number, running.outcome, running.ended, running.seconds) == (
        2,
        "running",
        None,
        None,
    )


def test_the_attempts_shown_are_capped_to_the_latest(settings):
    job = run(settings, fails_on_the_first_attempt)
    due_now(job, seconds_ago=1)
    run(settings, fails_on_the_first_attempt, job)
    capped = job_attempts(job=Job.objects.get(id=job.id), limit=1)
    assert capped.more and [a.number for a in capped.rows] == [2]
    assert job_attempts(job=job_in_state("queued")).rows == []


# --- the postgres executor ends its attempts the same way ----------------------------------


def test_a_postgres_executor_run_ends_with_the_same_attempt_line(
    settings, json_log_lines, django_capture_on_commit_callbacks
):
    settings.JOBOPS_QUEUE_EXECUTORS = {**settings.JOBOPS_QUEUE_EXECUTORS, "sim": "postgres"}
    moved = Moved()
    pending = job_in_state("pending", params={"steps": 1, "step_seconds": 0})
    with django_capture_on_commit_callbacks(execute=True):
        [job] = jobs_claim(queues=["sim"], locked_by="host-a:1:test", limit=1)
    assert job.id == pending.id
    finish = run_claimed(job, "host-a:1:test", process=False)  # what a runner decides
    assert finish is not None and (finish.job_type, finish.target) == ("sim", "succeeded")
    assert 0 <= finish.seconds < 10
    assert jobs_finish(finishes=[finish], locked_by="host-a:1:test") == []
    finish_log(structlog.get_logger("jobs.executor").bind(attempt=finish.attempt), finish)
    [line] = [x for x in json_log_lines() if x["event"] == "job_succeeded"]
    assert (line["attempt"], line["outcome"], line["error_code"]) == (1, "succeeded", None)
    assert line["duration_ms"] == round(finish.seconds * 1000)
    assert moved("job_duration_seconds_count", type="sim", status="succeeded") == 1
    assert moved("job_queue_latency_seconds_count", type="sim") == 1  # its batch claim
