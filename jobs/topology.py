"""The RabbitMQ topology of docs/architecture.md, built in one place.

`setup_topology` declares it and Celery's `task_queues` uses the same `Queue`
objects, so a worker never meets a queue whose arguments differ (RabbitMQ would
answer 406 PRECONDITION_FAILED and the worker would die). Queue arguments cannot
change in place: changing any value here needs a documented migration (declare a
new queue, move consumers, delete the old one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.conf import settings
from kombu import Exchange, Queue, binding

from jobs.types import POSTGRES, primary_queue_names, queue_executor

JOBS_EXCHANGE = Exchange("jobs.direct", type="direct", durable=True)
EVENTS_EXCHANGE = Exchange("events.jobs", type="topic", durable=True)
EVENT_ROUTING_KEY = "job.status.changed"
WATCH_QUEUE_NAME = "dlq.watch"
ERP_EVENTS_QUEUE_NAME = "erp.events"
PARKED_QUEUE_NAME = "erp.events.parked"

DELIVERY_LIMIT = 20
MAX_LENGTH = 1_000_000


def dlx_name(queue: str) -> str:
    return f"{queue}.dlx"


def dlq_name(queue: str) -> str:
    return f"{queue}_dlq"


def job_queue(name: str) -> Queue:
    return Queue(
        name,
        exchange=JOBS_EXCHANGE,
        routing_key=name,
        durable=True,
        queue_arguments={
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": dlx_name(name),
            # at-least-once dead-lettering needs reject-publish overflow; the default
            # at-most-once strategy can drop a dead letter.
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
            "x-delivery-limit": DELIVERY_LIMIT,
            "x-max-length": MAX_LENGTH,
        },
    )


def job_queues() -> list[Queue]:
    """The primary (quorum) queues, as Celery's `task_queues` and setup_topology use them."""
    return [job_queue(name) for name in primary_queue_names()]


def dlq_names() -> list[str]:
    """Every dead-letter queue, `<q>_dlq`, in the types table's order."""
    return [dlq_name(name) for name in primary_queue_names()]


def dlq_has_broker_copy(name: str) -> bool:
    """Whether the DLQ `name` (`<q>_dlq`) receives broker copies: not for a queue the
    postgres executor runs (docs/postgres-executor.md), whose dead letters are the
    database rows alone."""
    return queue_executor(name.removesuffix("_dlq")) != POSTGRES


def is_dlq(name: str) -> bool:
    return name in dlq_names()


def dead_letter_exchange(queue: str) -> Exchange:
    return Exchange(dlx_name(queue), type="topic", durable=True)


def dead_letter_queue(queue: str) -> Queue:
    # Classic and lazy: dead letters can pile up during an incident; keep them on disk.
    return Queue(
        dlq_name(queue),
        exchange=dead_letter_exchange(queue),
        routing_key="#",
        durable=True,
        queue_arguments={"x-queue-mode": "lazy"},
    )


def watch_queue() -> Queue:
    return Queue(
        WATCH_QUEUE_NAME,
        bindings=[binding(dead_letter_exchange(q), routing_key="#") for q in primary_queue_names()],
        durable=True,
    )


def parked_queue() -> Queue:
    """Events the ERP refused for good wait here for an operator (jobs/erp_bridge.py):
    default exchange, routing key = the queue's name."""
    return Queue(PARKED_QUEUE_NAME, durable=True, queue_arguments={"x-queue-mode": "lazy"})


def erp_events_queue() -> Queue:
    return Queue(
        ERP_EVENTS_QUEUE_NAME, exchange=EVENTS_EXCHANGE, routing_key=EVENT_ROUTING_KEY, durable=True
    )


def erp_configured() -> bool:
    """Whether this deployment sends events to an ERP (JOBOPS_ERP_EVENTS_URL is set)."""
    return bool(settings.JOBOPS_ERP_EVENTS_URL)


def erp_queues() -> list[Queue]:
    """The ERP bridge's queues, only where an ERP is configured: `erp.events` is durable
    and unbounded, so without a bridge consuming it it would keep every event forever
    (each one stored costs the broker about four times a routed-nowhere one)."""
    return [erp_events_queue(), parked_queue()] if erp_configured() else []


@dataclass
class Topology:
    exchanges: list[Exchange] = field(default_factory=list)
    queues: list[Queue] = field(default_factory=list)


def topology() -> Topology:
    names = primary_queue_names()
    return Topology(
        exchanges=[JOBS_EXCHANGE, EVENTS_EXCHANGE, *(dead_letter_exchange(q) for q in names)],
        queues=[
            *job_queues(),
            *(dead_letter_queue(q) for q in names),
            watch_queue(),
            *erp_queues(),
        ],
    )
