"""The RabbitMQ topology of docs/architecture.md, checked against the real broker with raw AMQP."""

from __future__ import annotations

import json
import uuid

import pytest
from amqp.exceptions import NotFound, PreconditionFailed
from django.conf import settings
from kombu import Connection, Producer

from core.broker import queue_renamed
from jobs.integrations.topology import (
    DELIVERY_LIMIT,
    ERP_EVENTS_QUEUE_NAME,
    EVENT_ROUTING_KEY,
    EVENTS_EXCHANGE,
    JOBS_EXCHANGE,
    PARKED_QUEUE_NAME,
    WATCH_QUEUE_NAME,
    dead_letter_queue,
    dlq_name,
    erp_events_queue,
    job_queue,
    job_queues,
    watch_queue,
)
from tests.processes import run_manage, subprocess_env
from tests.queues import depth, get_one, get_one_or_none, wait_depth


def _publish(channel, routing_key: str, body: dict) -> None:
    Producer(channel, exchange=JOBS_EXCHANGE).publish(
        body, routing_key=routing_key, serializer="json", mandatory=True
    )


def test_setup_topology_twice_exits_zero_and_keeps_queued_messages(amqp):
    _publish(amqp, "sim", {"marker": "kept"})
    assert wait_depth(amqp, "sim", 1) == 1
    first, second = run_manage("setup_topology"), run_manage("setup_topology")
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    assert "topology is in place" in second.stdout
    # Nothing was redeclared differently or purged: the message is still there.
    assert depth(amqp, "sim") == 1
    for queue in job_queues():  # and the arguments still match (else 406)
        queue(amqp).declare()


def test_setup_topology_reports_a_conflicting_queue_without_a_traceback(broker):
    with Connection(settings.BROKER_URL) as conn:
        channel = conn.channel()
        channel.queue_delete("report")
        # A classic queue named like a primary, with other arguments.
        channel.queue_declare("report", durable=True, auto_delete=False)
        try:
            result = run_manage("setup_topology")
            assert result.returncode != 0
            assert "Traceback" not in result.stderr + result.stdout
            assert "report" in result.stderr and "inequivalent arg" in result.stderr
            # Everything else was still declared.
            assert "declared queue sim_dlq" in result.stdout
        finally:
            conn.channel().queue_delete("report")
            job_queue("report")(conn.channel()).declare()
    # The restored queue has the design's arguments again.
    with Connection(settings.BROKER_URL) as conn:
        job_queue("report")(conn.channel()).declare()


def _exists(channel, queue: str) -> bool:
    try:
        channel.queue_declare(queue=queue, passive=True)
    except NotFound:
        return False
    return True


@pytest.fixture
def no_erp_queues(broker):
    """Neither ERP queue exists (a test vhost may hold them from an earlier run)."""
    with Connection(settings.BROKER_URL) as conn:
        for name in (ERP_EVENTS_QUEUE_NAME, PARKED_QUEUE_NAME):
            conn.channel().queue_delete(name)
        yield conn
        for name in (ERP_EVENTS_QUEUE_NAME, PARKED_QUEUE_NAME):
            conn.channel().queue_delete(name)


def test_without_an_erp_no_queue_is_declared_to_keep_events(no_erp_queues):
    """erp.events is durable and unbounded: with no bridge to consume it, it would keep
    every event for ever."""
    result = run_manage("setup_topology", env=subprocess_env(JOBOPS_ERP_EVENTS_URL=""))
    assert result.returncode == 0, result.stderr
    assert not _exists(no_erp_queues.channel(), ERP_EVENTS_QUEUE_NAME)
    assert not _exists(no_erp_queues.channel(), PARKED_QUEUE_NAME)
    assert ERP_EVENTS_QUEUE_NAME not in result.stderr  # nothing to warn about


def test_with_an_erp_its_queues_are_declared_and_erp_events_gets_every_event(no_erp_queues):
    result = run_manage(
        "setup_topology", env=subprocess_env(JOBOPS_ERP_EVENTS_URL="http://erp.invalid/events")
    )
    assert result.returncode == 0, result.stderr
    assert f"declared queue {ERP_EVENTS_QUEUE_NAME}" in result.stdout
    channel = no_erp_queues.channel()
    assert _exists(channel, PARKED_QUEUE_NAME)
    Producer(channel, exchange=EVENTS_EXCHANGE).publish(
        {"marker": "bound"}, routing_key=EVENT_ROUTING_KEY, serializer="json", mandatory=True
    )
    assert "bound" in str(get_one(channel, ERP_EVENTS_QUEUE_NAME).body)


def test_an_erp_queue_left_without_an_erp_is_reported_and_kept(no_erp_queues):
    """Left from before (an ERP configured then): setup_topology says that nothing
    consumes it and how to remove it, and leaves the decision and the events alone."""
    channel = no_erp_queues.channel()
    erp_events_queue()(channel).declare()
    Producer(channel, exchange=EVENTS_EXCHANGE).publish(
        {"marker": "old"}, routing_key=EVENT_ROUTING_KEY, serializer="json", mandatory=True
    )
    assert wait_depth(channel, ERP_EVENTS_QUEUE_NAME, 1) == 1
    result = run_manage("setup_topology", env=subprocess_env(JOBOPS_ERP_EVENTS_URL=""))
    assert result.returncode == 0, result.stderr
    assert f"{ERP_EVENTS_QUEUE_NAME} exists and holds 1 event(s)" in result.stderr
    assert f"rabbitmqctl delete_queue {ERP_EVENTS_QUEUE_NAME}" in result.stderr
    assert depth(channel, ERP_EVENTS_QUEUE_NAME) == 1


@pytest.mark.parametrize("queue", [q.name for q in job_queues()])
def test_each_routing_key_reaches_its_primary_quorum_queue(amqp, queue):
    marker = str(uuid.uuid4())
    _publish(amqp, queue, {"marker": marker})
    message = get_one(amqp, queue)
    assert marker in str(message.body)
    amqp.basic_ack(message.delivery_tag)
    # It is a quorum queue: redeclaring it as classic is refused.
    with pytest.raises(PreconditionFailed):
        amqp.queue_declare(queue, durable=True, passive=False, arguments={})


def test_reject_without_requeue_lands_in_its_dlq_and_the_watch_queue(amqp):
    for queue in [q.name for q in job_queues()]:
        _publish(amqp, queue, {"q": queue})
        message = get_one(amqp, queue)
        amqp.basic_reject(message.delivery_tag, requeue=False)
        for target in (dlq_name(queue), WATCH_QUEUE_NAME):
            copy = get_one(amqp, target)
            death = copy.headers["x-death"][0]
            assert death["reason"] == "rejected"
            assert death["queue"] == queue
            assert list(death["routing-keys"]) == [queue]
            assert copy.headers["x-first-death-reason"] == "rejected"
            amqp.basic_ack(copy.delivery_tag)
    # Nothing else was dead-lettered anywhere.
    for queue in job_queues():
        assert depth(amqp, dlq_name(queue.name)) == 0
    assert depth(amqp, WATCH_QUEUE_NAME) == 0


def test_a_message_that_crashes_its_consumer_is_dead_lettered_by_the_delivery_limit(amqp):
    """A consumer that dies before any claim (requeue or channel closed without ack)
    gets the message again and again; after the delivery limit the broker gives up."""
    _publish(amqp, "model", {"poison": True})
    deliveries = 0
    with Connection(settings.BROKER_URL) as conn:
        for _ in range(DELIVERY_LIMIT + 5):
            if deliveries % 2:  # a consumer whose channel dies with the message unacked
                channel = conn.channel()
                message = get_one_or_none(channel, "model", timeout=2)
                if message is None:
                    break
                channel.close()
            else:  # a consumer that gives it back (requeue) after crashing
                message = get_one_or_none(amqp, "model", timeout=2)
                if message is None:
                    break
                amqp.basic_reject(message.delivery_tag, requeue=True)
            deliveries += 1
    assert deliveries == DELIVERY_LIMIT + 1
    for target in (dlq_name("model"), WATCH_QUEUE_NAME):
        copy = get_one(amqp, target)
        assert copy.headers["x-first-death-reason"] == "delivery_limit"
        assert copy.headers["x-death"][0]["reason"] == "delivery_limit"
        amqp.basic_ack(copy.delivery_tag)
    assert depth(amqp, "model") == 0


def test_the_dead_letter_queues_and_the_watch_queue_are_quorum_by_default(amqp):
    """Replicated like the primaries, so they survive the loss of a broker node."""
    for queue in [dlq_name(q.name) for q in job_queues()] + [WATCH_QUEUE_NAME]:
        with pytest.raises(PreconditionFailed):  # a classic declaration is refused
            amqp.queue_declare(queue, durable=True, auto_delete=False, arguments={})
        amqp = amqp.connection.channel()
        amqp.queue_declare(
            queue, durable=True, auto_delete=False, arguments={"x-queue-type": "quorum"}
        )


def test_the_quorum_group_size_is_declared_only_when_set(settings):
    assert "x-quorum-initial-group-size" not in job_queue("sim").queue_arguments
    settings.JOBOPS_QUORUM_GROUP_SIZE = 3
    for queue in (job_queue("sim"), dead_letter_queue("sim"), watch_queue()):
        assert queue.queue_arguments["x-quorum-initial-group-size"] == 3


def test_classic_dead_letter_queues_keep_their_old_arguments(settings):
    settings.JOBOPS_DLQ_QUEUE_TYPE = "classic"
    assert dead_letter_queue("sim").queue_arguments == {"x-queue-mode": "lazy"}
    assert not watch_queue().queue_arguments


def _dead_letter(channel, queue: str, marker: str) -> None:
    Producer(channel, exchange=dead_letter_queue(queue).exchange).publish(
        {"marker": marker},
        routing_key=queue,
        serializer="json",
        headers={"job_id": marker},
        message_id=marker,
    )


def test_convert_moves_a_classic_dlq_to_quorum_keeping_every_message_and_its_routing(broker):
    """An existing deployment's classic sim_dlq (declared before quorum was the default):
    plain setup_topology names it; --convert re-declares it, every copy kept."""
    with Connection(settings.BROKER_URL) as conn:
        channel = conn.channel()
        channel.queue_delete("sim_dlq")
        classic = queue_renamed(
            dead_letter_queue("sim"), "sim_dlq", queue_arguments={"x-queue-mode": "lazy"}
        )
        classic(channel).declare()
        markers = [f"copy-{n}" for n in range(3)]
        for marker in markers:
            _dead_letter(channel, "sim", marker)
        assert wait_depth(channel, "sim_dlq", 3) == 3

        refused = run_manage("setup_topology")
        assert refused.returncode != 0 and "sim_dlq" in refused.stderr
        assert "--convert" in refused.stderr

        converted = run_manage("setup_topology", "--convert")
        assert converted.returncode == 0, converted.stderr
        assert "converted queue sim_dlq: 3 message(s) moved" in converted.stdout, converted.stdout
        channel = conn.channel()
        dead_letter_queue("sim")(channel).declare()  # quorum now: no 406
        assert not _exists(channel, "sim_dlq.converting")
        _dead_letter(channel, "sim", "after")  # still bound to sim.dlx
        assert wait_depth(channel, "sim_dlq", 4) == 4
        moved = [get_one(channel, "sim_dlq") for _ in range(4)]
        assert sorted(m.headers["job_id"] for m in moved) == sorted([*markers, "after"])
        assert {m.properties["message_id"] for m in moved} == {*markers, "after"}
        again = run_manage("setup_topology", "--convert")
        assert again.returncode == 0 and "converted" not in again.stdout


def test_erp_events_receives_progress_events_only_while_opted_in(no_erp_queues):
    """JOBOPS_ERP_EVENTS_PROGRESS on binds erp.events to job.progress; turned off, the
    next setup_topology removes that binding (a declaration only ever adds one)."""
    erp = {"JOBOPS_ERP_EVENTS_URL": "http://erp.invalid/events"}
    channel = no_erp_queues.channel()

    def first_to_arrive() -> str:
        """A progress event, then a status event: which erp.events holds first."""
        producer = Producer(channel, exchange=EVENTS_EXCHANGE)
        producer.publish({"marker": "progress"}, routing_key="job.progress", serializer="json")
        producer.publish({"marker": "status"}, routing_key=EVENT_ROUTING_KEY, serializer="json")
        first = get_one(channel, ERP_EVENTS_QUEUE_NAME)
        channel.basic_ack(first.delivery_tag)
        channel.queue_purge(ERP_EVENTS_QUEUE_NAME)
        return json.loads(first.body)["marker"]

    on = run_manage("setup_topology", env=subprocess_env(**erp, JOBOPS_ERP_EVENTS_PROGRESS="on"))
    assert on.returncode == 0, on.stderr
    assert first_to_arrive() == "progress"
    off = run_manage("setup_topology", env=subprocess_env(**erp, JOBOPS_ERP_EVENTS_PROGRESS="off"))
    assert off.returncode == 0, off.stderr
    assert first_to_arrive() == "status"
