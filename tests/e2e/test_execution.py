"""Execution end to end: a real worker and dispatcher, RabbitMQ, PostgreSQL and Redis.

ai, model and cam run tests.handlers.scripted here (see tests/processes.py); sim and
report run their reference handlers.
"""

from __future__ import annotations

import json

import pytest
from django.conf import settings
from kombu import Connection

from audit.models import AuditLog
from audit.services import Actor
from jobs.integrations.publisher import message_publish
from jobs.integrations.topology import dlq_name
from jobs.models import DeadLetter, Job
from jobs.services import job_cancel
from tests import handlers
from tests.factories import UserFactory, make_job
from tests.polling import wait_for
from tests.processes import job_events as events
from tests.processes import job_finished as finished
from tests.queues import drain

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("broker")]


def script(job_type="ai", **params):
    return make_job(job_type=job_type, params=params)


def dlq_job_ids(queue):
    ids = []
    for message in drain(dlq_name(queue)):
        args = json.loads(message.body)[0]
        assert message.headers["x-death"][0]["queue"] == queue
        ids.append(args[0]["job_id"])
    return ids


def test_sim_job_runs_to_succeeded_with_progress_and_audit(shared_worker):
    job = make_job(job_type="sim", params={"steps": 5, "step_seconds": 0.1})
    done = finished(job.id)
    assert done.status == "succeeded"
    assert done.attempts == 1 and done.locked_by is None
    assert done.progress_percent == 100 and done.progress_step == "5/5"
    assert done.result["steps"] == 5
    # Its result as a JSON artefact, written by the worker's process
    # (docs/architecture.md#planning-artefacts).
    artefact = done.artefacts.get()
    assert (artefact.kind, artefact.name) == ("result", "sim.json")
    assert json.loads(artefact.file.read()) == done.result
    trail = events(job.id)
    assert trail[:3] == ["created", "queued", "started"] and trail[-1] == "succeeded"
    assert "progress" in trail


def test_report_handler_writes_a_csv_artefact(shared_worker):
    owner = UserFactory()
    report = make_job(owner, job_type="report", params={"limit": 10})
    done = finished(report.id)
    assert done.status == "succeeded", done.last_error_message
    artefact = done.artefacts.get()
    assert (artefact.kind, artefact.name) == ("report", "jobs.csv")
    assert artefact.content_type == "text/csv"
    assert str(report.id) in artefact.file.read().decode()


def test_retryable_failures_retry_with_jittered_backoff_then_succeed(shared_worker, scripted):
    job = script(do="fail_times", n=2)
    done = finished(job.id)
    assert done.status == "succeeded" and done.attempts == 3
    assert events(job.id).count("retrying") == 2
    runs = handlers.runs(job.id)
    assert [r["attempt"] for r in runs] == [1, 2, 3]
    retries = AuditLog.objects.filter(job_id=job.id, event_type="retrying").order_by("seq")
    base = 0.2  # JOBOPS_BACKOFF_BASE_SECONDS in the worker (tests.processes.FAST_ENV)
    for n, (entry, before, after) in enumerate(zip(retries, runs, runs[1:], strict=False), 1):
        delay = json.loads(entry.payload)["data"]["delay_ms"] / 1000
        bound = min(20, base * 2 ** (n - 1))
        assert 0.5 * bound - 0.001 <= delay <= 1.5 * bound + 0.001
        # The next run never starts before its delay has passed.
        assert after["t"] - before["t"] >= delay - 0.05
    assert not DeadLetter.objects.filter(job_id=job.id).exists()


def test_exhausted_retries_dead_letter_in_database_and_broker(shared_worker, scripted):
    job = script(do="fail_times", n=99)  # ai: max_retries 3 -> 4 attempts
    done = finished(job.id)
    assert done.status == "failed" and done.attempts == 4
    assert done.dead_letter_queue == "default_dlq" and done.last_error_code == "PLANNED"
    row = DeadLetter.objects.get(job_id=job.id)
    assert (row.reason, row.state, row.queue) == ("exhausted", "open", "default_dlq")
    assert wait_for(lambda: str(job.id) in dlq_job_ids("default"), timeout=10)
    # The dispatcher's watcher saw the broker's copy too (via dlq.watch).
    wait_for(lambda: DeadLetter.objects.get(job_id=job.id).broker_copy, timeout=10)


@pytest.mark.parametrize(
    ("do", "reason", "code"),
    [("fatal", "fatal", "PLANNED_FATAL"), ("nonretryable", "nonretryable", "PLANNED_INVALID")],
)
def test_fatal_and_nonretryable_dead_letter_at_once(shared_worker, scripted, do, reason, code):
    job = script(job_type="model", do=do)
    done = finished(job.id)
    assert done.status == "failed" and done.attempts == 1
    row = DeadLetter.objects.get(job_id=job.id)
    assert (row.reason, row.error_code, row.queue) == (reason, code, "model_dlq")
    assert "retrying" not in events(job.id)
    assert wait_for(lambda: str(job.id) in dlq_job_ids("model"), timeout=10)


@pytest.mark.parametrize("kind", ["nan", "nul", "deep"])
def test_a_result_that_cannot_be_stored_fails_fatally(shared_worker, scripted, kind):
    job = script(job_type="model", do="bad_result", kind=kind)
    done = finished(job.id)
    # Before: a DataError at the final write, then the reaper, six times, `worker_lost`.
    assert (done.status, done.attempts, done.last_error_code) == ("failed", 1, "RESULT_INVALID")
    assert done.result is None
    row = DeadLetter.objects.get(job_id=job.id)
    assert (row.reason, row.error_code, row.state) == ("fatal", "RESULT_INVALID", "open")


def test_report_lists_only_its_owners_jobs(shared_worker):
    alice, bob = UserFactory(), UserFactory()
    alices = make_job(owner=alice, job_type="sim", params={"steps": 1, "step_seconds": 0})
    bobs = make_job(owner=bob, job_type="sim", params={"steps": 1, "step_seconds": 0})
    report = make_job(owner=alice, job_type="report", params={})
    done = finished(report.id)
    assert done.status == "succeeded", done.last_error_message
    csv_text = done.artefacts.get().file.read().decode()
    assert str(alices.id) in csv_text and str(report.id) in csv_text
    assert str(bobs.id) not in csv_text
    staff = UserFactory(is_staff=True)
    wide = make_job(owner=staff, job_type="report", params={"all_owners": True}, staff=True)
    wide = finished(wide.id)
    wide_text = wide.artefacts.get().file.read().decode()
    assert str(alices.id) in wide_text and str(bobs.id) in wide_text


def test_annotate_runs_on_the_light_queue_and_names_the_targets_entry(shared_worker):
    owner = UserFactory()
    target = finished(make_job(owner, job_type="sim", params={"steps": 1, "step_seconds": 0}).id)
    entry = AuditLog.objects.get(job_id=target.id, seq=3)
    params = {"target_job_id": str(target.id), "target_seq": 3, "label": "seen"}
    done = finished(make_job(owner, job_type="annotate", params=params).id)
    assert done.status == "succeeded", done.last_error_message
    written = AuditLog.objects.get(job_id=done.id, event_type="annotated")
    data = json.loads(written.payload)["data"]
    assert (data["target_seq"], data["target_hash"]) == (3, entry.chain_hash)
    assert events(target.id)[-1] == "succeeded"  # nothing appended to the target's chain


@pytest.mark.parametrize("then", ["crash", "fatal"])
def test_a_cancel_is_honoured_when_the_handler_then_fails(shared_worker, scripted, then):
    job = script(job_type="model", do="wait_then", then=then)
    wait_for(lambda: Job.objects.get(id=job.id).status == "running", timeout=20)
    job_cancel(job_id=job.id, actor=Actor.system("test"))
    handlers.redis_client().set(handlers.key(job.id, "go"), "1")
    done = finished(job.id)
    # Before: `retrying` (then run again) or `failed` with a dead letter to discard.
    assert (done.status, done.attempts) == ("cancelled", 1)
    assert not DeadLetter.objects.filter(job_id=job.id).exists()
    assert "retrying" not in events(job.id) and events(job.id)[-1] == "cancelled"


def test_running_sim_cancelled_at_step_three_stops_within_a_step(shared_worker):
    job = make_job(job_type="sim", params={"steps": 20, "step_seconds": 0.3})
    wait_for(
        lambda: Job.objects.get(id=job.id).progress_percent >= 15, timeout=20, interval=0.02
    )  # step 3 of 20
    at_cancel = Job.objects.get(id=job.id).progress_percent
    job_cancel(job_id=job.id, actor=Actor.system("test"))
    done = finished(job.id)
    assert done.status == "cancelled" and done.attempts == 1
    # The coalesced progress may lag one write (0.3 s = one step) behind the handler.
    assert done.progress_percent <= at_cancel + 10
    assert not DeadLetter.objects.filter(job_id=job.id).exists()
    assert "retrying" not in events(job.id) and events(job.id)[-1] == "cancelled"


def test_a_message_published_twice_runs_the_job_once(shared_worker, scripted):
    job = script(job_type="model", do="steps", steps=3, step_seconds=0.2)
    message_publish(job=Job.objects.get(id=job.id))  # a second delivery of the same job
    done = finished(job.id)
    assert done.status == "succeeded" and done.attempts == 1
    assert len(handlers.runs(job.id)) == 1
    assert events(job.id).count("started") == 1


def test_a_message_naming_no_job_is_rejected_to_the_dlq(shared_worker):
    from config.celery import app

    with Connection(settings.BROKER_URL) as conn:
        app.send_task("jobs.ai", args=[{"nonsense": True}], connection=conn)
    assert wait_for(lambda: drain("default_dlq"), timeout=10)
