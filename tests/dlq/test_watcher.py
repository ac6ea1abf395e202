"""The dead-letter watcher reconciles each case of docs/architecture.md, idempotently."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from kombu import Producer

from audit.models import AuditLog
from audit.services import OPS_CHAIN, Actor, job_chain
from audit.verification import audit_verify
from dlq.broker import decode_amqp
from dlq.services.reconcile import Outcome, dead_letter_reconcile, dead_letters_reconcile
from dlq.watcher import watch_once
from jobs.domain.states import Status
from jobs.integrations.topology import DELIVERY_LIMIT, JOBS_EXCHANGE, WATCH_QUEUE_NAME
from jobs.models import DeadLetter, Job
from jobs.services import Fence, job_claim, job_fail_with_dead_letter
from tests.factories import job_in_state
from tests.processes import job_events
from tests.queues import dead_letter_by_reject, depth, get_one, publish_job_message, wait_depth

pytestmark = pytest.mark.django_db
WORKER = Actor.system("worker")


def test_worker_made_dead_letter_seen_by_watcher_only_records_the_broker_copy(amqp):
    job = job_in_state("queued")
    publish_job_message(job)  # attempt 1, as the dispatcher publishes it
    message = get_one(amqp, "sim")
    job_claim(job_id=job.id, locked_by="w1")
    # The worker's order: commit failed + row, then reject without requeue.
    job_fail_with_dead_letter(
        job_id=job.id, reason="fatal", error_code="BOOM", actor=WORKER, fence=Fence("w1", 1)
    )
    amqp.basic_reject(message.delivery_tag, requeue=False)
    before = job_events(job.id)

    assert _wait_watch(amqp) == 1

    row = DeadLetter.objects.get(job=job)
    assert row.broker_copy and row.state == "open" and row.reason == "fatal"
    assert row.error_code == "BOOM"  # the worker's diagnosis stays
    assert row.x_death[0]["reason"] == "rejected" and row.x_death[0]["queue"] == "sim"
    assert row.headers["job_id"] == str(job.id) and row.message_id
    assert Job.objects.get(id=job.id).status == Status.FAILED
    assert job_events(job.id) == [*before, "dead_lettered"]
    assert depth(amqp, WATCH_QUEUE_NAME) == 0
    assert depth(amqp, "sim_dlq") == 1  # the operators' copy stays


def _wait_watch(amqp, expected: int = 1) -> int:
    # Dead-lettering is asynchronous: wait until the watch copy is there.
    wait_depth(amqp, WATCH_QUEUE_NAME, expected)
    return watch_once()


def test_broker_made_dead_letter_of_a_queued_job_fails_it_with_an_open_row(amqp):
    job = job_in_state("queued")
    publish_job_message(job)
    # A consumer crashing before the claim, until the delivery limit dead-letters it.
    for _ in range(DELIVERY_LIMIT + 1):
        message = get_one(amqp, "sim", timeout=2)
        amqp.basic_reject(message.delivery_tag, requeue=True)

    assert _wait_watch(amqp) == 1

    job.refresh_from_db()
    assert job.status == Status.FAILED and job.dead_letter_queue == "sim_dlq"
    assert job.last_error_code == "BROKER_DELIVERY_LIMIT"
    row = DeadLetter.objects.get(job=job)
    assert (row.state, row.reason, row.queue, row.broker_copy) == (
        "open",
        "delivery_limit",
        "sim_dlq",
        True,
    )
    assert row.x_death[0]["reason"] == "delivery_limit"
    events = job_events(job.id)
    assert events[-2:] == ["failed", "dead_lettered"]
    failed = AuditLog.objects.get(chain=job_chain(job.id), event_type="failed")
    assert json.loads(failed.payload)["data"]["reason"] == "delivery_limit"


def test_a_live_lock_leaves_the_running_job_untouched_and_records_the_message(amqp):
    job = job_in_state("queued")
    dead_letter_by_reject(amqp, job)  # e.g. a duplicate delivery rejected elsewhere
    job_claim(job_id=job.id, locked_by="w1")  # ... while the job runs under a live lock

    assert watch_once() == 1

    job.refresh_from_db()
    assert (job.status, job.locked_by, job.attempts) == (Status.RUNNING, "w1", 1)
    row = DeadLetter.objects.get(job=job)
    assert row.state == "discarded" and row.broker_copy and row.resolved_by is None
    assert "live lock" in row.justification
    assert job_events(job.id)[-1] == "dead_lettered"
    assert depth(amqp, "sim_dlq") == 0  # its broker copy needs no operator: swept
    # No open row blocks the run's own outcome: the worker can still dead-letter it.
    job_fail_with_dead_letter(job_id=job.id, reason="fatal", actor=WORKER, fence=Fence("w1", 1))
    assert DeadLetter.objects.filter(job=job, state="open").count() == 1


def test_a_stale_lock_fails_the_running_job(amqp, settings):
    settings.JOBOPS_LOCK_TIMEOUT = 5
    job = job_in_state("queued")
    dead_letter_by_reject(amqp, job)
    job_claim(job_id=job.id, locked_by="w1")
    Job.objects.filter(id=job.id).update(locked_at=timezone.now() - timedelta(seconds=60))

    assert watch_once() == 1

    job.refresh_from_db()
    assert job.status == Status.FAILED and job.locked_by is None
    row = DeadLetter.objects.get(job=job)
    assert (row.state, row.reason, row.broker_copy) == ("open", "rejected", True)


def test_a_repeat_of_the_same_message_changes_nothing(amqp):
    job = job_in_state("queued")
    dead_letter_by_reject(amqp, job)
    # A watcher that committed but died before its ack: the message comes back.
    message = get_one(amqp, WATCH_QUEUE_NAME)
    assert dead_letter_reconcile(message=decode_amqp(message)) == Outcome.FAILED
    amqp.basic_reject(message.delivery_tag, requeue=True)
    wait_depth(amqp, WATCH_QUEUE_NAME, 1)  # a quorum queue's requeue lands a moment later
    rows, events = DeadLetter.objects.count(), job_events(job.id)

    assert watch_once() == 1

    assert DeadLetter.objects.count() == rows and job_events(job.id) == events
    assert Job.objects.get(id=job.id).status == Status.FAILED
    assert depth(amqp, WATCH_QUEUE_NAME) == 0


def _raw_dead_letter(amqp, body, *, headers=None, routing_key="erp") -> None:
    Producer(amqp, exchange=JOBS_EXCHANGE).publish(
        body,
        routing_key=routing_key,
        headers=headers or {},
        content_type="application/octet-stream",
        content_encoding="binary",
    )
    before = depth(amqp, WATCH_QUEUE_NAME)
    message = get_one(amqp, routing_key)
    amqp.basic_reject(message.delivery_tag, requeue=False)
    wait_depth(amqp, WATCH_QUEUE_NAME, before + 1)


def test_an_undecodable_message_becomes_a_row_without_a_job(amqp):
    _raw_dead_letter(amqp, b"\x00\xffnot a celery message")

    assert watch_once() == 1

    row = DeadLetter.objects.get()
    assert row.job_id is None and row.state == "open" and row.queue == "erp_dlq"
    assert row.error_code == "UNDECODABLE" and row.reason == "rejected"
    assert row.body.startswith("base64:") and row.broker_copy
    entry = AuditLog.objects.filter(chain=OPS_CHAIN).latest("seq")
    assert entry.event_type == "dead_lettered" and entry.job_id is None

    # The same message again (another copy with the same content) adds nothing.
    assert watch_once() == 0
    assert DeadLetter.objects.count() == 1


def test_a_message_naming_an_unknown_job_becomes_a_row_without_a_job(amqp):
    _raw_dead_letter(
        amqp,
        json.dumps([[{"job_id": "0b7f5d5e-3c2a-4d7e-9b0e-3f1f6c1d2a11"}], {}, {}]).encode(),
        headers={"id": "task-1", "task": "jobs.erp"},
    )
    assert watch_once() == 1
    row = DeadLetter.objects.get()
    assert row.job_id is None and row.error_code == "JOB_NOT_FOUND"
    assert row.message_id == "task:task-1"


def test_a_copy_from_before_a_replay_is_stale_and_leaves_the_job_alone(amqp):
    job = job_in_state("queued")
    dead_letter_by_reject(amqp, job)  # attempt 1's message
    job_claim(job_id=job.id, locked_by="w1")
    job_fail_with_dead_letter(job_id=job.id, reason="fatal", actor=WORKER, fence=Fence("w1", 1))
    # Replayed before the watcher saw the copy: the job is pending again. Behind the
    # services' back, so that the replay's own pass over the DLQ leaves the copy there.
    DeadLetter.objects.filter(job=job).update(
        state="replayed", resolved_at=timezone.now(), justification="x"
    )
    Job.objects.filter(id=job.id).update(status=Status.PENDING)

    assert watch_once() == 1

    assert Job.objects.get(id=job.id).status == Status.PENDING
    assert DeadLetter.objects.filter(job=job, state="open").count() == 0
    assert depth(amqp, "sim_dlq") == 0  # the stale copy was acked away as well


def test_watch_once_with_nothing_waiting_returns_zero_at_once(broker):
    assert watch_once() == 0


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        (b"x", {"id": "t" * 300, "task": "jobs.erp"}),  # a message_id past its column
        (b"x", {"id": "task-nul", "job_id": "a\x00b", "note": "NUL\x00here"}),
        (b'[[{"job_id": "x\\u0000y", "s": "\\ud800"}], {}, {}]', {"id": "task-esc"}),
        (b"[" * 5000 + b"]" * 5000, {"x-first-death-queue": "q" * 200}),
    ],
    ids=["long-message-id", "nul-in-headers", "nul-and-surrogate-in-body", "deep-body"],
)
def test_a_hostile_message_is_recorded_sanitised_and_the_next_one_follows(amqp, body, headers):
    """Before: any DatabaseError requeued the message, which then blocked dlq.watch."""
    _raw_dead_letter(amqp, body, headers=headers)
    _raw_dead_letter(amqp, b"the next one")
    # At-least-once dead-lettering (quorum queues) may still bring an earlier test's
    # rejected message in after the purge: ours are the last two recorded.
    assert watch_once() >= 2
    rows = list(DeadLetter.objects.order_by("id"))[-2:]
    assert all(r.job_id is None and r.state == "open" for r in rows)
    assert rows[1].body == "the next one"
    hostile = rows[0]
    assert len(hostile.message_id) <= 255 and hostile.queue == "erp_dlq"
    assert "\x00" not in json.dumps(hostile.headers, ensure_ascii=False) + (hostile.body or "")
    assert depth(amqp, WATCH_QUEUE_NAME) == 0


def test_a_burst_of_dead_letters_is_recorded_in_batches_and_nothing_is_left(amqp):
    """More messages than one batch (WATCH_BATCH): every one recorded once, the queue
    drained, the batches committed and acked as wholes."""
    from dlq.watcher import WATCH_BATCH

    count = WATCH_BATCH + 37
    producer = Producer(amqp, exchange=JOBS_EXCHANGE)
    for n in range(count):
        producer.publish(
            f"not json {n}".encode(),
            routing_key="erp",
            content_type="application/octet-stream",
            content_encoding="binary",
        )
    for _ in range(count):
        amqp.basic_reject(get_one(amqp, "erp").delivery_tag, requeue=False)
    wait_depth(amqp, WATCH_QUEUE_NAME, count)
    assert watch_once(timeout=30) == count
    assert depth(amqp, WATCH_QUEUE_NAME) == 0
    rows = DeadLetter.objects.filter(job__isnull=True, error_code="UNDECODABLE")
    assert rows.count() == count
    assert rows.values("message_id").distinct().count() == count


def _mixed_burst(amqp) -> dict[str, Any]:
    """In one batch: broker-made dead letters of queued jobs, a second copy of one of
    them, a copy of a job running under a live lock, and an undecodable message."""
    queued = [job_in_state("queued") for _ in range(5)]
    for job in queued:
        dead_letter_by_reject(amqp, job)
    dead_letter_by_reject(amqp, queued[0])  # the same job's message dead-lettered twice
    running = job_in_state("queued")
    dead_letter_by_reject(amqp, running)
    job_claim(job_id=running.id, locked_by="w1")
    Producer(amqp, exchange=JOBS_EXCHANGE).publish(
        b"not json", routing_key="erp", content_type="application/octet-stream"
    )
    amqp.basic_reject(get_one(amqp, "erp").delivery_tag, requeue=False)
    wait_depth(amqp, WATCH_QUEUE_NAME, 8)
    return {"queued": queued, "running": running}


def _assert_burst_recorded(amqp, jobs: dict[str, Any]) -> None:
    assert depth(amqp, WATCH_QUEUE_NAME) == 0
    for job in jobs["queued"]:
        stored = Job.objects.get(id=job.id)
        assert (stored.status, stored.dead_letter_queue) == (Status.FAILED, "sim_dlq")
        assert stored.last_error_code == "BROKER_REJECTED"
        row = DeadLetter.objects.get(job=job)  # one row, the second copy changed nothing
        assert (row.state, row.reason, row.broker_copy) == ("open", "rejected", True)
        assert row.x_death[0]["queue"] == "sim" and row.message_id
        assert job_events(job.id)[-2:] == ["failed", "dead_lettered"]
        entry = AuditLog.objects.get(chain=job_chain(job.id), event_type="dead_lettered")
        assert json.loads(entry.payload)["data"]["dead_letter_id"] == row.id
    running = Job.objects.get(id=jobs["running"].id)
    assert running.status == Status.RUNNING
    assert DeadLetter.objects.get(job=running).state == "discarded"  # recorded, resolved
    assert DeadLetter.objects.filter(job__isnull=True, error_code="UNDECODABLE").count() == 1
    assert audit_verify().ok


def test_a_mixed_burst_is_recorded_in_one_batch_as_one_by_one_would(amqp):
    jobs = _mixed_burst(amqp)
    assert watch_once() == 8
    _assert_burst_recorded(amqp, jobs)


def test_when_the_batch_statement_fails_every_message_is_recorded_one_by_one(amqp, monkeypatch):
    jobs = _mixed_burst(amqp)

    def refuse(**_: Any) -> None:
        raise ValueError("a value the batch could not take")

    monkeypatch.setattr("dlq.watcher.dead_letters_reconcile", refuse)
    assert watch_once() == 8
    _assert_burst_recorded(amqp, jobs)


def test_the_batch_decides_the_burst_it_can_and_leaves_the_rest_to_one_by_one(amqp):
    jobs = _mixed_burst(amqp)
    decoded = [decode_amqp(get_one(amqp, WATCH_QUEUE_NAME)) for _ in range(8)]

    outcomes = dead_letters_reconcile(messages=decoded)

    first_copies = [str(job.id) for job in jobs["queued"]]
    assert [d.job_id for d in decoded[:5]] == first_copies  # the queue keeps their order
    assert outcomes[:5] == [Outcome.FAILED] * 5
    # The second copy of the first job, the running job and the undecodable message.
    assert outcomes[5:] == [None, None, None]
    assert DeadLetter.objects.filter(job_id__in=first_copies, state="open").count() == 5
    # Again (a redelivery after a crash before the ack): every message id is a repeat.
    assert dead_letters_reconcile(messages=decoded[:5]) == [Outcome.REPEAT] * 5
    assert DeadLetter.objects.count() == 5
