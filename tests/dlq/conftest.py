"""Fixtures for the dead-letter tests: the real topology in this run's vhost, raw AMQP."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from kombu import Connection

from audit.services import Actor
from dlq.watcher import watch_once
from jobs.models import Job
from jobs.services import Fence, job_claim, job_fail_with_dead_letter, transition
from jobs.states import Status
from jobs.topology import WATCH_QUEUE_NAME, dlq_name
from tests.factories import make_job
from tests.workers import topology_declare_and_purge

WORKER = Actor.system("worker")


@pytest.fixture
def topology() -> Iterator[None]:
    """DESIGN.md 4 declared in this vhost, every queue purged before and after."""
    topology_declare_and_purge()
    yield
    topology_declare_and_purge()


@pytest.fixture
def amqp(topology: None) -> Iterator[Any]:
    """A raw py-amqp channel on BROKER_URL (the vhost of this run)."""
    with Connection(settings.BROKER_URL, connect_timeout=10) as conn:
        channel = conn.channel()
        yield channel


def depth(channel: Any, queue: str) -> int:
    return channel.queue_declare(queue=queue, passive=True)[1]


def wait_depth(channel: Any, queue: str, expected: int, timeout: float = 10) -> int:
    """Poll a queue's ready count until it is `expected` (dead-lettering is async)."""
    deadline = time.monotonic() + timeout
    while True:
        current = depth(channel, queue)
        if current == expected or time.monotonic() > deadline:
            return current
        time.sleep(0.02)


def get_one(channel: Any, queue: str, timeout: float = 10) -> Any:
    """basic_get (no ack) with a short poll: a requeued message may take a moment."""
    deadline = time.monotonic() + timeout
    while True:
        message = channel.basic_get(queue=queue, no_ack=False)
        if message is not None or time.monotonic() > deadline:
            return message
        time.sleep(0.01)


def publish_job_message(job: Any) -> None:
    """Publish exactly what the dispatcher publishes for this job (Celery protocol 2)."""
    from jobs.publisher import message_publish

    message_publish(job=job)


def dead_letter_by_reject(channel: Any, job: Any) -> Any:
    """Publish the job's message, take it from its primary queue as a consumer would,
    and reject it without requeue: the broker dead-letters it to `<q>_dlq` and the watch
    queue. Returns the rejected message."""
    dlq_before = depth(channel, dlq_name(job.queue))
    watch_before = depth(channel, WATCH_QUEUE_NAME)
    publish_job_message(job)
    message = get_one(channel, job.queue)
    assert message is not None, "published message not found in its primary queue"
    channel.basic_reject(message.delivery_tag, requeue=False)
    assert wait_depth(channel, dlq_name(job.queue), dlq_before + 1) == dlq_before + 1
    assert wait_depth(channel, WATCH_QUEUE_NAME, watch_before + 1) == watch_before + 1
    return message


def worker_dead_letter(amqp, *, job_type="sim", code="BOOM", params=None):
    """The full worker path: published, claimed, failed + row, rejected, watched."""
    job = make_job(job_type=job_type, params=params)
    # In a transactional test the job was published on commit already (and is queued).
    if Job.objects.get(id=job.id).status == Status.PENDING:
        job = transition(job_id=job.id, target=Status.QUEUED, actor=WORKER)
        publish_job_message(job)
    message = get_one(amqp, job.queue)
    claimed = job_claim(job_id=job.id, locked_by="w1")
    job_fail_with_dead_letter(
        job_id=job.id,
        reason="nonretryable",
        error_code=code,
        error_message="planned",
        actor=WORKER,
        fence=Fence("w1", claimed.attempts),
    )
    amqp.basic_reject(message.delivery_tag, requeue=False)
    wait_depth(amqp, WATCH_QUEUE_NAME, 1)
    assert watch_once() == 1
    return Job.objects.get(id=job.id)


def worker_lost(job_type="sim"):
    """A dead letter without a broker copy: the reaper's `worker_lost`."""
    job = make_job(job_type=job_type)
    job_claim(job_id=job.id, locked_by="w1")
    job_fail_with_dead_letter(job_id=job.id, reason="worker_lost", actor=WORKER)
    return Job.objects.get(id=job.id)


def job_failed(code: str, reason: str = "exhausted", job_type: str = "sim") -> Job:
    """A job a worker failed with a dead letter (`code`, `reason`), no broker copy."""
    params = {"event": "order.created"} if job_type == "erp" else None
    job = make_job(job_type=job_type, params=params)
    claimed = job_claim(job_id=job.id, locked_by="w1")
    job_fail_with_dead_letter(
        job_id=job.id,
        reason=reason,
        error_code=code,
        error_message=f"{code} happened",
        actor=WORKER,
        fence=Fence("w1", claimed.attempts),
    )
    return Job.objects.get(id=job.id)
