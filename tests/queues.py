"""RabbitMQ for tests: the topology of docs/architecture.md in this run's vhost, raw AMQP reads.

The `broker` and `amqp` fixtures (tests/conftest.py) build on these. Everything here
talks to the real broker at settings.BROKER_URL; dead-lettering is asynchronous there,
so reads that expect a message wait for it with a deadline and fail loudly.
"""

from __future__ import annotations

from typing import Any

from amqp.exceptions import PreconditionFailed
from django.conf import settings
from kombu import Connection

from audit.services import Actor
from dlq.watcher import watch_once
from jobs.integrations.publisher import message_publish
from jobs.integrations.topology import WATCH_QUEUE_NAME, dlq_name, topology
from jobs.models import Job
from jobs.services import job_claim, job_fail_with_dead_letter
from tests.factories import fence_of, job_in_state
from tests.polling import wait_for

WORKER = Actor.system("worker")


def topology_declare_and_purge() -> None:
    """Declare the topology in the current vhost and empty every queue of it.

    A queue left by an older run with other arguments (RabbitMQ answers 406: the DLQs
    were classic before they became quorum) is deleted and declared again: the test
    run owns its vhost, and the queue is emptied anyway."""
    plan = topology()
    with Connection(settings.BROKER_URL, connect_timeout=10) as conn:
        channel = conn.channel()
        for entity in plan.exchanges:
            entity(channel).declare()
        for queue in plan.queues:
            try:
                queue(channel).declare()
            except PreconditionFailed:
                channel = conn.channel()  # the 406 closed the channel
                channel.queue_delete(queue.name)
                queue(channel).declare()
        for queue in plan.queues:
            queue(channel).purge()


def depth(channel: Any, queue: str) -> int:
    """The queue's ready count, now."""
    return channel.queue_declare(queue=queue, passive=True)[1]


def wait_depth(channel: Any, queue: str, expected: int, timeout: float = 10) -> int:
    """Wait until the queue's ready count is `expected` (dead-lettering is asynchronous)."""
    try:
        wait_for(
            lambda: depth(channel, queue) == expected,
            timeout=timeout,
            interval=0.02,
            what=f"{expected} message(s) ready in {queue}",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {depth(channel, queue)} ready now") from None
    return expected


def drain(queue: str) -> list[Any]:
    """Every message ready in `queue`, consumed: the test owns this run's vhost."""
    found = []
    with Connection(settings.BROKER_URL, connect_timeout=10) as conn:
        channel = conn.channel()
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            found.append(message)
    return found


def get_one_or_none(channel: Any, queue: str, timeout: float = 10) -> Any:
    """basic_get (no ack) of one message, or None when none arrives within `timeout`."""
    try:
        return get_one(channel, queue, timeout=timeout)
    except AssertionError:
        return None


def get_one(channel: Any, queue: str, timeout: float = 10) -> Any:
    """basic_get (no ack) of one message, waiting for it: a requeued one takes a moment."""
    return wait_for(
        lambda: channel.basic_get(queue=queue, no_ack=False),
        timeout=timeout,
        interval=0.01,
        what=f"a message in {queue}",
    )


def publish_job_message(job: Job) -> None:
    """Publish exactly what the dispatcher publishes for this job (Celery protocol 2)."""
    message_publish(job=job)


def dead_letter_by_reject(channel: Any, job: Job) -> Any:
    """Publish the job's message, take it from its primary queue as a consumer would,
    and reject it without requeue: the broker dead-letters it to `<q>_dlq` and the watch
    queue. Returns the rejected message."""
    dlq_before = depth(channel, dlq_name(job.queue))
    watch_before = depth(channel, WATCH_QUEUE_NAME)
    publish_job_message(job)
    message = get_one(channel, job.queue)
    channel.basic_reject(message.delivery_tag, requeue=False)
    wait_depth(channel, dlq_name(job.queue), dlq_before + 1)
    wait_depth(channel, WATCH_QUEUE_NAME, watch_before + 1)
    return message


def worker_dead_letter(
    channel: Any, *, job_type: str = "sim", code: str = "BOOM", params: dict | None = None
) -> Job:
    """The full worker path: published, claimed, failed + row, rejected, watched."""
    job = job_in_state("queued", job_type=job_type, params=params)
    publish_job_message(job)
    message = get_one(channel, job.queue)
    claimed = job_claim(job_id=job.id, locked_by="w1")
    job_fail_with_dead_letter(
        job_id=job.id,
        reason="nonretryable",
        error_code=code,
        error_message="planned",
        actor=WORKER,
        fence=fence_of(claimed),
    )
    channel.basic_reject(message.delivery_tag, requeue=False)
    wait_depth(channel, WATCH_QUEUE_NAME, 1)
    assert watch_once() == 1
    return Job.objects.get(id=job.id)
