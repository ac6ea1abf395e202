"""Replay and discard of dead letters (docs/operations/dead-letters.md), with the broker copies."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from audit.models import AuditLog
from audit.services import OPS_CHAIN, job_chain
from dlq.broker import dlq_drain, dlq_peek
from dlq.errors import (
    DeadLetterInputError,
    DeadLetterPermissionError,
    JustificationRequiredError,
    UnknownQueueError,
)
from dlq.services.copies import broker_copies_ack_stale
from dlq.services.replay import dead_letters_discard, dead_letters_replay
from dlq.watcher import watch_once
from jobs.domain.states import Status
from jobs.integrations.topology import WATCH_QUEUE_NAME
from jobs.models import DeadLetter, Job
from tests.factories import OperatorFactory, UserFactory, job_in_state
from tests.queues import (
    depth,
    get_one,
    publish_job_message,
    topology_declare_and_purge,
    wait_depth,
    worker_dead_letter,
)

pytestmark = pytest.mark.django_db


def test_replay_dry_run_counts_and_samples_without_writing(amqp):
    jobs = [worker_dead_letter(amqp) for _ in range(3)]
    operator = OperatorFactory()
    audit_rows = AuditLog.objects.count()

    result = dead_letters_replay(
        actor_user=operator, justification="check", queue="sim_dlq", dry_run=True
    )

    assert result.dry_run and result.matched == 3 and len(result.sample) == 3
    assert {s["job_id"] for s in result.sample} == {str(j.id) for j in jobs}
    assert result.resolved == []
    assert AuditLog.objects.count() == audit_rows
    assert DeadLetter.objects.filter(state="open").count() == 3
    assert all(Job.objects.get(id=j.id).status == Status.FAILED for j in jobs)
    assert depth(amqp, "sim_dlq") == 3


def test_replay_moves_failed_to_pending_with_audit_and_drops_the_broker_copy(amqp):
    replayed, other = worker_dead_letter(amqp), worker_dead_letter(amqp)
    operator = OperatorFactory()
    before = replayed.max_attempts

    result = dead_letters_replay(
        actor_user=operator,
        justification="upstream fixed (INC-42)",
        queue="sim_dlq",
        job_ids=[replayed.id],
    )

    assert result.resolved and result.job_ids == [str(replayed.id)] and not result.skipped
    job = Job.objects.get(id=replayed.id)
    assert job.status == Status.PENDING and job.dead_letter_queue is None
    assert job.attempts == 1 and job.max_attempts == before + 6  # sim: max_retries 5
    assert job.last_error_code == "BOOM"  # history until a success clears it
    row = DeadLetter.objects.get(job=replayed)
    assert row.state == "replayed" and row.resolved_by == operator
    assert row.justification == "upstream fixed (INC-42)" and row.resolved_at
    entry = AuditLog.objects.filter(chain=job_chain(job.id)).latest("seq")
    assert entry.event_type == "dlq_replayed" and entry.actor_id == str(operator.pk)
    data = json.loads(entry.payload)["data"]
    assert (data["from"], data["to"], data["dead_letter_id"]) == ("failed", "pending", row.id)
    # The replayed job's copy is gone from the DLQ; the other job's copy stays.
    assert result.broker_acked == 1
    left = dlq_peek(queue="sim_dlq", limit=10)
    assert [m.job_id for m in left] == [str(other.id)]
    assert DeadLetter.objects.get(job=other).state == "open"


def test_replay_can_publish_the_job_itself(amqp):
    job = worker_dead_letter(amqp)
    result = dead_letters_replay(
        actor_user=OperatorFactory(), justification="go", queue="sim_dlq", publish=True
    )
    assert result.published == 1
    assert Job.objects.get(id=job.id).status == Status.QUEUED
    message = get_one(amqp, "sim")
    payload = json.loads(message.body)[0][0]
    assert payload["job_id"] == str(job.id) and payload["attempt"] == 2


def test_replay_is_retry_safe(amqp):
    job = worker_dead_letter(amqp)
    operator = OperatorFactory()
    first = dead_letters_replay(actor_user=operator, justification="once", job_ids=[job.id])
    events = AuditLog.objects.filter(chain=job_chain(job.id)).count()

    again = dead_letters_replay(actor_user=operator, justification="once", job_ids=[job.id])

    assert first.resolved and not again.resolved and again.matched == 0
    assert AuditLog.objects.filter(chain=job_chain(job.id)).count() == events
    assert Job.objects.get(id=job.id).max_attempts == 12


def test_replay_of_a_worker_lost_dead_letter_without_a_broker_copy(broker):
    job = job_in_state("failed", reason="worker_lost")
    row = DeadLetter.objects.get(job=job)
    assert not row.broker_copy and row.queue == "sim_dlq"

    result = dead_letters_replay(
        actor_user=OperatorFactory(), justification="node replaced", job_ids=[job.id]
    )

    assert result.resolved == [row.id] and result.broker_error is None
    assert Job.objects.get(id=job.id).status == Status.PENDING


def test_replay_of_a_broker_made_dead_letter(amqp):
    job = job_in_state("queued", job_type="ai", params={"text": "x"})
    publish_job_message(job)
    for _ in range(21):  # x-delivery-limit 20
        message = get_one(amqp, "default", timeout=2)
        amqp.basic_reject(message.delivery_tag, requeue=True)
    wait_depth(amqp, WATCH_QUEUE_NAME, 1)
    watch_once()
    assert Job.objects.get(id=job.id).status == Status.FAILED

    result = dead_letters_replay(
        actor_user=OperatorFactory(), justification="poison fixed", queue="default_dlq"
    )

    job.refresh_from_db()
    assert result.resolved and job.status == Status.PENDING and job.max_attempts == 8
    assert depth(amqp, "default_dlq") == 0


def test_replay_skips_a_row_whose_job_is_no_longer_failed(broker):
    job = job_in_state("failed", reason="worker_lost")
    # Behind the service's back: the job was re-run by other means meanwhile.
    Job.objects.filter(id=job.id).update(status=Status.PENDING)
    result = dead_letters_replay(actor_user=OperatorFactory(), justification="x", job_ids=[job.id])
    assert not result.resolved and "pending" in result.skipped[0]["skipped"]
    assert DeadLetter.objects.get(job=job).state == "open"


def test_replay_and_discard_refuse_a_missing_justification_or_a_non_staff_actor(broker):
    job = job_in_state("failed", reason="worker_lost")
    for text in ("", "   ", None):
        with pytest.raises(JustificationRequiredError) as refused:
            dead_letters_replay(actor_user=OperatorFactory(), justification=text, job_ids=[job.id])
        assert refused.value.code == "ERR-DLQ-422"
    with pytest.raises(DeadLetterPermissionError):
        dead_letters_discard(actor_user=UserFactory(), justification="x", job_ids=[job.id])
    with pytest.raises(UnknownQueueError):
        dead_letters_discard(actor_user=OperatorFactory(), justification="x", queue="nope")
    assert DeadLetter.objects.get(job=job).state == "open"


def test_discard_closes_the_row_keeps_the_job_failed_and_drops_the_copy(amqp):
    job = worker_dead_letter(amqp, code="BAD_INPUT")
    operator = OperatorFactory()

    dry = dead_letters_discard(
        actor_user=operator,
        justification="bad input",
        filters={"error_code": "BAD_INPUT"},
        dry_run=True,
    )
    assert dry.matched == 1 and DeadLetter.objects.get(job=job).state == "open"
    result = dead_letters_discard(
        actor_user=operator, justification="bad input", filters={"error_code": "BAD_INPUT"}
    )

    row = DeadLetter.objects.get(job=job)
    assert result.resolved == [row.id] and row.state == "discarded"
    assert row.resolved_by == operator and row.justification == "bad input"
    assert Job.objects.get(id=job.id).status == Status.FAILED
    entry = AuditLog.objects.filter(chain=job_chain(job.id)).latest("seq")
    assert entry.event_type == "dlq_discarded"
    assert depth(amqp, "sim_dlq") == 0
    # Again: nothing left to discard, no error.
    again = dead_letters_discard(actor_user=operator, justification="x", job_ids=[job.id])
    assert again.matched == 0 and not again.resolved


def test_discard_of_a_row_without_a_job_audits_on_the_ops_chain(amqp):
    from kombu import Producer

    from jobs.integrations.topology import JOBS_EXCHANGE

    Producer(amqp, exchange=JOBS_EXCHANGE).publish(b"junk", routing_key="erp")
    message = get_one(amqp, "erp")
    amqp.basic_reject(message.delivery_tag, requeue=False)
    wait_depth(amqp, WATCH_QUEUE_NAME, 1)
    watch_once()
    row = DeadLetter.objects.get(job=None)

    replay = dead_letters_replay(actor_user=OperatorFactory(), justification="x", queue="erp_dlq")
    assert replay.matched == 0  # nothing to run again
    result = dead_letters_discard(
        actor_user=OperatorFactory(), justification="junk", queue="erp_dlq"
    )

    assert result.resolved == [row.id] and result.broker_acked == 1
    assert AuditLog.objects.filter(chain=OPS_CHAIN).latest("seq").event_type == "dlq_discarded"
    assert depth(amqp, "erp_dlq") == 0


def test_peek_returns_decoded_messages_without_consuming_them(amqp):
    jobs = [worker_dead_letter(amqp) for _ in range(3)]

    peeked = dlq_peek(queue="sim_dlq", limit=2)

    assert [m.job_id for m in peeked] == [str(j.id) for j in jobs[:2]]
    first = peeked[0]
    assert first.task == "jobs.sim" and first.routing_key == "sim" and first.queue == "sim"
    assert first.reason == "rejected" and first.x_death[0]["count"] == 1
    assert first.payload["type"] == "sim" and first.attempt == 1
    # Nothing consumed: the two come back (a quorum queue settles a requeue through
    # Raft, so the count catches up a moment later) ...
    assert wait_depth(amqp, "sim_dlq", 3) == 3
    # ... at the back of the quorum DLQ (RabbitMQ 3.10 requeues there): a peek of the
    # whole queue sees every message once.
    everything = [m.job_id for m in dlq_peek(queue="sim_dlq", limit=3)]
    assert sorted(everything) == sorted(str(j.id) for j in jobs)
    assert everything[0] == str(jobs[2].id)


def test_peek_keeps_the_order_of_a_classic_dlq(amqp, settings):
    settings.JOBOPS_DLQ_QUEUE_TYPE = "classic"
    topology_declare_and_purge()  # sim_dlq classic, as JOBOPS_DLQ_QUEUE_TYPE says
    amqp = amqp.connection.channel()  # RabbitMQ keeps per-channel state by queue name
    try:
        jobs = [worker_dead_letter(amqp) for _ in range(3)]
        assert [m.job_id for m in dlq_peek(queue="sim_dlq", limit=2)] == [
            str(j.id) for j in jobs[:2]
        ]
        assert depth(amqp, "sim_dlq") == 3
        # Order is kept: a second peek sees the same first messages.
        peeked = [m.job_id for m in dlq_peek(queue="sim_dlq", limit=3)]
        assert peeked == [str(j.id) for j in jobs]
    finally:
        settings.JOBOPS_DLQ_QUEUE_TYPE = "quorum"
        topology_declare_and_purge()


def test_ack_away_pass_keeps_copies_of_open_rows_and_unwatched_new_ones(amqp):
    kept = worker_dead_letter(amqp)
    gone = worker_dead_letter(amqp)
    DeadLetter.objects.filter(job=gone).update(
        state="discarded",
        resolved_at=timezone.now(),
        justification="x",
    )
    result = broker_copies_ack_stale(queue="sim_dlq")
    assert (result.seen, result.acked, result.kept) == (2, 1, 1)
    assert [m.job_id for m in dlq_peek(queue="sim_dlq", limit=5)] == [str(kept.id)]


def test_a_drain_pass_acks_what_is_decided_in_batches_and_requeues_the_rest_in_order(amqp):
    import amqp as pyamqp

    amqp.queue_purge("sim_dlq")
    for n in range(7):
        amqp.basic_publish(
            pyamqp.Message(b"[]", application_headers={"id": f"t{n}", "task": "jobs.sim"}),
            exchange="",
            routing_key="sim_dlq",
        )
    wait_depth(amqp, "sim_dlq", 7)
    batches: list[list[str]] = []

    def decide(messages):
        batches.append([m.message_id for m in messages])
        return {m.message_id for m in messages if int(m.message_id[-1]) % 2 == 0}

    result = dlq_drain(queue="sim_dlq", decide=decide, batch_size=2, max_messages=5)

    assert batches == [["task:t0", "task:t1"], ["task:t2", "task:t3"], ["task:t4"]]
    assert (result.seen, result.acked, result.kept) == (5, 3, 2)
    assert result.acked_message_ids == ["task:t0", "task:t2", "task:t4"]
    # The kept ones and the two past the budget are back (a quorum DLQ requeues each
    # at its back, in the order RabbitMQ settles them).
    wait_depth(amqp, "sim_dlq", 4)
    assert sorted(m.message_id for m in dlq_peek(queue="sim_dlq", limit=10)) == [
        "task:t1",
        "task:t3",
        "task:t5",
        "task:t6",
    ]


def test_peek_refuses_anything_but_a_dead_letter_queue(broker):
    # A get-and-requeue on a primary quorum queue would count towards its delivery limit.
    for name in ("sim", "dlq.watch", "nope"):
        with pytest.raises(UnknownQueueError):
            dlq_peek(queue=name, limit=1)


def test_replay_refuses_a_bad_limit_and_accepts_job_ids_from_a_generator(broker):
    job = job_in_state("failed", reason="worker_lost")
    with pytest.raises(DeadLetterInputError):
        dead_letters_replay(actor_user=OperatorFactory(), justification="x", limit=0)
    result = dead_letters_replay(
        actor_user=OperatorFactory(), justification="x", job_ids=(j for j in [job.id]), limit=5
    )
    assert result.job_ids == [str(job.id)]
