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
import uuid
from typing import Any

from celery import current_app
from django.conf import settings

from core.broker import broker_connection, broker_connection_drop
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


def message_publish(*, job: Job, timeout: float | None = None) -> None:
    """Publish one job's message and wait for the broker's confirm.

    Raises on any failure: connection refused, an unroutable message (`mandatory`
    makes RabbitMQ return it, and py-amqp raises), a nack, a confirm timeout.
    `timeout` bounds the connect and the confirm (JOBOPS_PUBLISH_TIMEOUT_SECONDS).
    """
    timeout = timeout or settings.JOBOPS_PUBLISH_TIMEOUT_SECONDS
    spec = get_type(job.type)
    assert spec is not None
    headers = message_headers(job)
    app = current_app
    # Fail fast (one connect attempt): the caller is an API request or the dispatcher
    # loop, and the job is safe in the database either way.
    conn = broker_connection(confirm=True, timeout=timeout)
    try:
        producer = app.amqp.Producer(conn.default_channel, auto_declare=False)
        with publish_span(traceparent=job.traceparent, job_id=str(job.id), job_type=job.type):
            app.send_task(
                spec.task_name,
                args=[wire_payload(job)],
                task_id=str(uuid.uuid4()),
                producer=producer,
                headers=headers,
                mandatory=True,
                retry=False,
                # Topology belongs to setup_topology; an undeclared queue must fail
                # loudly (unroutable) rather than be created here with whatever arguments.
                declare=[],
                confirm_timeout=timeout,
            )
    except Exception:
        broker_connection_drop(conn)
        raise
