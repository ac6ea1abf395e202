"""Sending a job's message to RabbitMQ: the wire payload, its headers, a confirmed publish.

Transport only: which job to publish and what a confirm means for its status are the
services' (`jobs.services.publishing`). The wire payload (the task's one argument) is
`{v, job_id, type, params, submitted_by, attempt, created_at, request_id, correlation_id,
org_id, project_id, actor_type, idempotency_key_sha256, scheduled_for}` (`v`: the payload
version, `jobs.integrations.wire`; the last four are additive: a worker reads none of
them, so they needed no new version); the message headers
(`message_headers`) carry `job_id`, `org_id`, `request_id`, `correlation_id` and the
attempt too, and on a retry or a replay the previous attempt's error code and exception
class, so that a message read in a DLQ peek (or RabbitMQ's management UI) explains itself
without decoding the body. Never the error's text: it may hold what a handler saw.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import connection
from kombu.utils.json import dumps as json_dumps

from core.broker import (
    PublishError,
    broker_connection,
    broker_connection_drop,
    confirm_channel,
)
from core.tracing import publish_span
from jobs.domain.types import get_type
from jobs.integrations.wire import PAYLOAD_VERSION
from jobs.models import Job
from jobs.queries import QUERIES


def key_digest(key: str | None) -> str | None:
    """What a message says of a job's idempotency key: its sha256, hex. A key is the
    client's (an order number, an email, up to 255 characters); the message sits in
    queues, DLQ peeks and the management UI, so it carries a bounded fingerprint the
    client can compute from its own key, never the key."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest() if key is not None else None


# wire_payload's actor_type when its caller has not looked it up (a batch has).
_LOOK_UP: Any = object()


def wire_payload(job: Job, *, actor_type: str | None = _LOOK_UP) -> dict[str, Any]:
    """The task's one argument for `job`; `actor_type`: who made the job (its `created`
    entry's, created_actor_types: looked up here when not given), None when unknown."""
    if actor_type is _LOOK_UP:
        actor_type = created_actor_types([str(job.id)]).get(str(job.id))
    return {
        # The payload version (jobs.integrations.wire): workers of the next release still read it.
        "v": PAYLOAD_VERSION,
        "job_id": str(job.id),
        "type": job.type,
        "params": job.params,
        "submitted_by": str(job.owner_id),
        "attempt": job.attempts + 1,
        "created_at": job.created_at.isoformat(),
        "request_id": job.request_id,
        "correlation_id": job.correlation_id,
        # The tenant the worker checks against the row before it runs the job
        # (docs/tenancy.md#execution): an integer, the row's NOT NULL org_id.
        "org_id": job.org_id,
        # Additive (docs/architecture.md#publishing): the job contract's context for
        # consumers of the queues; today's workers read none of it.
        "project_id": job.project_id,
        "actor_type": actor_type,
        "idempotency_key_sha256": key_digest(job.idempotency_key),
        "scheduled_for": job.run_at.isoformat() if job.run_at else None,
    }


def created_actor_types(job_ids: list[str]) -> dict[str, str]:
    """Who made each job, by id (jobs_created_actor_types): one statement a batch."""
    if not job_ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["jobs_created_actor_types"], {"ids": job_ids})
        return {str(job_id): actor_type for job_id, actor_type in cursor.fetchall()}


def args_repr(job: Job) -> str:
    """The task arguments as Celery headers and events show them (`argsrepr`)."""
    return f"[{{'job_id': '{job.id}', 'type': {job.type!r}, 'attempt': {job.attempts + 1}}}]"


# "ValueError: ..." -> "ValueError": the class name finish_decide (jobs.execution) puts first.
_ERROR_CLASS = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]{0,99}):")


def message_headers(job: Job) -> dict[str, Any]:
    headers: dict[str, Any] = {
        "job_id": str(job.id),
        "org_id": job.org_id,
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


class MessageTooLarge(str):
    """Why a job's message was refused before the broker: over JOBOPS_MAX_MESSAGE_BYTES.
    A refusal no retry cures (RabbitMQ's max_message_size, set to match, would refuse
    it too); every other refusal in `messages_publish`'s answer is a plain str."""


class MessageTooLargeError(PublishError):
    pass


# The embed part of Celery's protocol 2 body: (args, kwargs, embed).
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def message_body_size(payload: dict[str, Any]) -> int:
    """The bytes of the message body a job's wire payload makes, as Celery serializes
    it (JSON, the task_serializer of config/celery.py)."""
    return len(json_dumps(([payload], {}, _EMBED)).encode("utf-8"))


def _oversized(payload: dict[str, Any], limit: int) -> MessageTooLarge | None:
    size = message_body_size(payload)
    if size <= limit:
        return None
    return MessageTooLarge(f"message of {size} bytes exceeds JOBOPS_MAX_MESSAGE_BYTES={limit}")


def messages_publish(*, jobs: list[Job], timeout: float | None = None) -> dict[str, str]:
    """Publish one message per job and wait once for the broker's confirms of them all.

    0. A job whose message would exceed JOBOPS_MAX_MESSAGE_BYTES is not sent: it is
       refused here with a MessageTooLarge reason, before it reaches the broker.
    1. The confirm-mode channel of this thread's connection, kept between batches
       (core.broker.confirm_channel); `mandatory` publishes, no wait between messages,
       so a batch costs one round trip.
    2. Wait until every delivery tag is settled, at most `timeout`
       (JOBOPS_PUBLISH_TIMEOUT_SECONDS).
    Returns {job id: why} for the messages the broker refused (nacked, or returned as
    unroutable); every other job's message is confirmed. Raises PublishError (or the
    connection error) when the broker cannot be reached or confirms are missing: then
    no job of the batch may count as published (a repeat is harmless, the claim fences
    it).
    """
    timeout = timeout or settings.JOBOPS_PUBLISH_TIMEOUT_SECONDS
    limit = settings.JOBOPS_MAX_MESSAGE_BYTES
    refused: dict[str, str] = {}
    sendable: list[tuple[Job, dict[str, Any]]] = []
    actor_types = created_actor_types([str(job.id) for job in jobs])
    for job in jobs:
        payload = wire_payload(job, actor_type=actor_types.get(str(job.id)))
        too_large = _oversized(payload, limit)
        if too_large is None:
            sendable.append((job, payload))
        else:
            refused[str(job.id)] = too_large
    if not sendable:
        return refused
    app = current_app
    conn = broker_connection(timeout=timeout)
    tags: dict[int, str] = {}
    task_jobs: dict[str, str] = {}
    try:
        channel, confirms = confirm_channel(conn)
        producer = app.amqp.Producer(channel, auto_declare=False)
        for job, payload in sendable:
            spec = get_type(job.type)
            assert spec is not None
            task_id = str(uuid.uuid4())
            with publish_span(traceparent=job.traceparent, job_id=str(job.id), job_type=job.type):
                app.send_task(
                    spec.task_name,
                    args=[payload],
                    task_id=task_id,
                    producer=producer,
                    headers=message_headers(job),
                    mandatory=True,
                    retry=False,
                    # Topology belongs to setup_topology; an undeclared queue must fail
                    # loudly (unroutable) rather than be created here with other arguments.
                    declare=[],
                    # What Celery's events and the worker's log show of the arguments: the job,
                    # never its params (they may hold what a user would not have
                    # logged), and no repr walk of the payload per message.
                    argsrepr=args_repr(job),
                    kwargsrepr="{}",
                )
            tags[confirms.published()], task_jobs[task_id] = str(job.id), str(job.id)
        confirms.wait(timeout=timeout)
    except Exception:
        broker_connection_drop(conn)  # the channel's state is unknown: start afresh
        raise
    if confirms.nacked:
        # A nack from a quorum queue often means its leader was lost (a broker node
        # died): RabbitMQ 3.10 goes on nacking on that channel after a new leader was
        # elected, so the next batch starts on a fresh connection and channel.
        broker_connection_drop(conn)
    refused.update({tags[tag]: "nacked by the broker" for tag in confirms.nacked})
    # Celery sets the message's correlation_id to its task id.
    for properties, why in confirms.returned:
        job_id = task_jobs.get(str(properties.get("correlation_id")))
        if job_id is not None:
            refused[job_id] = why
    return refused


def message_publish(*, job: Job, timeout: float | None = None) -> None:
    """Publish one job's message and wait for its confirm; raises when it was refused
    (MessageTooLargeError when it was not sent for its size)."""
    refused = messages_publish(jobs=[job], timeout=timeout)
    if refused:
        why = refused[str(job.id)]
        raise (MessageTooLargeError if isinstance(why, MessageTooLarge) else PublishError)(why)
