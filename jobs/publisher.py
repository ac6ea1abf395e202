"""Sending a job's message to RabbitMQ: the wire payload, its headers, a confirmed publish.

Transport only: which job to publish and what a confirm means for its status are the
services' (`jobs.services.publishing`). The wire payload (the task's one argument) is
`{job_id, type, params, submitted_by, attempt, created_at, request_id, correlation_id}`;
the message headers (`message_headers`) carry `job_id`, `request_id`, `correlation_id`
and the attempt too, and on a retry or a replay the previous attempt's error code and
exception class, so that a message read in a DLQ peek or in Flower explains itself
without decoding the body. Never the error's text: it may hold what a handler saw.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from celery import current_app
from django.conf import settings

from core.broker import broker_connection, broker_connection_drop, channel_close_quietly
from core.tracing import publish_span
from jobs.models import Job
from jobs.types import get_type


def wire_payload(job: Job) -> dict[str, Any]:
    return {
        "job_id": str(job.id),
        "type": job.type,
        "params": job.params,
        "submitted_by": str(job.owner_id),
        "attempt": job.attempts + 1,
        "created_at": job.created_at.isoformat(),
        "request_id": job.request_id,
        "correlation_id": job.correlation_id,
    }


# "ValueError: ..." -> "ValueError": the class name runtime._finish puts first.
_ERROR_CLASS = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]{0,99}):")


def message_headers(job: Job) -> dict[str, Any]:
    headers: dict[str, Any] = {
        "job_id": str(job.id),
        "request_id": job.request_id,
        "correlation_id": job.correlation_id,
        "attempt": job.attempts + 1,
    }
    if job.last_error_code:
        headers["last_error_code"] = job.last_error_code
        match = _ERROR_CLASS.match(job.last_error_message or "")
        if match:
            headers["last_error_class"] = match.group(1)
    return headers


class PublishError(Exception):
    """The broker could not take a batch: unreachable, or confirms missing in time."""


@dataclass
class _Confirms:
    """Publisher confirms of one channel: delivery tags 1, 2, ... in publish order."""

    pending: set[int] = field(default_factory=set)
    refused: dict[int, str] = field(default_factory=dict)  # tag -> why
    returned: dict[str, str] = field(default_factory=dict)  # task id -> why

    def on_ack(self, tag: int, multiple: bool) -> None:
        self.pending -= {t for t in self.pending if t <= tag} if multiple else {tag}

    def on_nack(self, tag: int, multiple: bool) -> None:
        settled = {t for t in self.pending if t <= tag} if multiple else {tag} & self.pending
        self.pending -= settled
        self.refused.update(dict.fromkeys(settled, "nacked by the broker"))

    def on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        # mandatory: an unroutable message comes back (then its ack follows, which alone
        # would look like success). Celery sets correlation_id to the task id.
        task_id = (getattr(message, "properties", None) or {}).get("correlation_id", "")
        self.returned[str(task_id)] = f"returned by {exchange or '-'}/{routing_key}: {exc}"


def messages_publish(*, jobs: list[Job], timeout: float | None = None) -> dict[str, str]:
    """Publish one message per job and wait once for the broker's confirms of them all.

    1. A channel of this thread's connection in confirm mode (core.broker), `mandatory`
       publishes: no wait between messages, so a batch costs one round trip.
    2. Wait until every delivery tag is settled, at most `timeout`
       (JOBOPS_PUBLISH_TIMEOUT_SECONDS).
    Returns {job id: why} for the messages the broker refused (nacked, or returned as
    unroutable); every other job's message is confirmed. Raises PublishError (or the
    connection error) when the broker cannot be reached or confirms are missing: then
    no job of the batch may count as published (a repeat is harmless, the claim fences
    it).
    """
    timeout = timeout or settings.JOBOPS_PUBLISH_TIMEOUT_SECONDS
    app = current_app
    conn = broker_connection(timeout=timeout)
    confirms = _Confirms()
    tags: dict[int, str] = {}
    task_jobs: dict[str, str] = {}
    try:
        channel = conn.channel()
        channel.events["basic_ack"].add(confirms.on_ack)
        channel.events["basic_nack"].add(confirms.on_nack)
        channel.events["basic_return"].add(confirms.on_return)
        channel.confirm_select()
        producer = app.amqp.Producer(channel, auto_declare=False)
        for tag, job in enumerate(jobs, start=1):
            spec = get_type(job.type)
            assert spec is not None
            task_id = str(uuid.uuid4())
            tags[tag], task_jobs[task_id] = str(job.id), str(job.id)
            confirms.pending.add(tag)
            with publish_span(traceparent=job.traceparent, job_id=str(job.id), job_type=job.type):
                app.send_task(
                    spec.task_name,
                    args=[wire_payload(job)],
                    task_id=task_id,
                    producer=producer,
                    headers=message_headers(job),
                    mandatory=True,
                    retry=False,
                    # Topology belongs to setup_topology; an undeclared queue must fail
                    # loudly (unroutable) rather than be created here with other arguments.
                    declare=[],
                )
        deadline = time.monotonic() + timeout
        while confirms.pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PublishError(f"{len(confirms.pending)} confirms missing after {timeout} s")
            conn.drain_events(timeout=remaining)
    except Exception:
        broker_connection_drop(conn)  # the channel's state is unknown: start afresh
        raise
    channel_close_quietly(channel)
    refused = {tags[tag]: why for tag, why in confirms.refused.items()}
    refused.update({task_jobs[t]: why for t, why in confirms.returned.items() if t in task_jobs})
    return refused


def message_publish(*, job: Job, timeout: float | None = None) -> None:
    """Publish one job's message and wait for its confirm; raises when it was refused."""
    refused = messages_publish(jobs=[job], timeout=timeout)
    if refused:
        raise PublishError(refused[str(job.id)])
