"""The RabbitMQ topology of docs/architecture.md, built in one place.

`setup_topology` declares it and Celery's `task_queues` uses the same `Queue`
objects, so a worker never meets a queue whose arguments differ (RabbitMQ would
answer 406 PRECONDITION_FAILED and the worker would die). Queue arguments cannot
change in place: changing any value here needs a documented migration (declare a
new queue, move consumers, delete the old one); the DLQs and dlq.watch change type with
`setup_topology --convert` (docs/operations/dead-letters.md#queue-type).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from kombu import Exchange, Queue, binding

from jobs.domain.types import POSTGRES, primary_queue_names, queue_executor

JOBS_EXCHANGE = Exchange("jobs.direct", type="direct", durable=True)
EVENTS_EXCHANGE = Exchange("events.jobs", type="topic", durable=True)
EVENT_ROUTING_KEY = "job.status.changed"
# A coalesced progress write's event (jobs_progress_event): its type and routing key.
PROGRESS_ROUTING_KEY = "job.progress"
WATCH_QUEUE_NAME = "dlq.watch"
ERP_EVENTS_QUEUE_NAME = "erp.events"
PARKED_QUEUE_NAME = "erp.events.parked"

DELIVERY_LIMIT = 20
MAX_LENGTH = 1_000_000


def dlx_name(queue: str) -> str:
    return f"{queue}.dlx"


def dlq_name(queue: str) -> str:
    return f"{queue}_dlq"


def quorum_arguments() -> dict[str, Any]:
    """What every quorum queue of jobops is declared with: its type and, where
    JOBOPS_QUORUM_GROUP_SIZE is set, how many cluster nodes hold a replica."""
    arguments: dict[str, Any] = {"x-queue-type": "quorum"}
    if settings.JOBOPS_QUORUM_GROUP_SIZE:
        arguments["x-quorum-initial-group-size"] = settings.JOBOPS_QUORUM_GROUP_SIZE
    return arguments


def dead_letter_arguments() -> dict[str, Any]:
    """The arguments of the DLQs and dlq.watch, by JOBOPS_DLQ_QUEUE_TYPE.

    Quorum by default: replicated by Raft, they survive the loss of a broker node as the
    primaries do, and they support all the DLQ tools need (basic.get, requeue, acks).
    They get no delivery limit, so a peek's get-and-requeue never drops a copy. Classic
    (lazy: dead letters can pile up during an incident; kept on disk) lives on one node
    and is unavailable while that node is down.
    """
    if settings.JOBOPS_DLQ_QUEUE_TYPE == "classic":
        return {"x-queue-mode": "lazy"}
    return quorum_arguments()


def job_queue(name: str) -> Queue:
    return Queue(
        name,
        exchange=JOBS_EXCHANGE,
        routing_key=name,
        durable=True,
        queue_arguments={
            **quorum_arguments(),
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
    return Queue(
        dlq_name(queue),
        exchange=dead_letter_exchange(queue),
        routing_key="#",
        durable=True,
        queue_arguments=dead_letter_arguments(),
    )


def watch_queue() -> Queue:
    classic = settings.JOBOPS_DLQ_QUEUE_TYPE == "classic"
    return Queue(
        WATCH_QUEUE_NAME,
        bindings=[binding(dead_letter_exchange(q), routing_key="#") for q in primary_queue_names()],
        durable=True,
        # Classic as before (no arguments); quorum with the DLQs.
        queue_arguments=None if classic else quorum_arguments(),
    )


def convertible_queues() -> list[Queue]:
    """The queues `setup_topology --convert` may re-declare with another type: copies
    of what the database holds (the DLQs) and the watcher's feed, never a primary."""
    return [*(dead_letter_queue(q) for q in primary_queue_names()), watch_queue()]


def parked_queue() -> Queue:
    """Events the ERP refused for good wait here for an operator (jobs/processes/erp_bridge.py):
    default exchange, routing key = the queue's name."""
    return Queue(PARKED_QUEUE_NAME, durable=True, queue_arguments={"x-queue-mode": "lazy"})


def erp_routing_keys() -> tuple[str, ...]:
    """The event types the ERP receives: changes of status, and progress events where
    JOBOPS_ERP_EVENTS_PROGRESS opts in (a running job writes one every
    JOBOPS_PROGRESS_INTERVAL_SECONDS: many more POSTs than its changes of status)."""
    if settings.JOBOPS_ERP_EVENTS_PROGRESS:
        return (EVENT_ROUTING_KEY, PROGRESS_ROUTING_KEY)
    return (EVENT_ROUTING_KEY,)


def erp_receives(event_type: str) -> bool:
    """Whether an event of this type goes to the ERP (where one is configured)."""
    return erp_configured() and event_type in erp_routing_keys()


def erp_events_queue() -> Queue:
    """`erp.events`, bound to `events.jobs` once per routing key the ERP receives.
    setup_topology removes the job.progress binding when the opt-in is off."""
    return Queue(
        ERP_EVENTS_QUEUE_NAME,
        exchange=EVENTS_EXCHANGE,
        bindings=[binding(EVENTS_EXCHANGE, routing_key=key) for key in erp_routing_keys()],
        durable=True,
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
