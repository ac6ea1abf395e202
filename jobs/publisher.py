"""Publishing jobs to RabbitMQ with publisher confirms and `mandatory` (DESIGN.md 3.5).

Only a broker confirm moves a job `pending` -> `queued` (or a due `retrying` ->
`queued`). A publish that fails (broker down, unroutable, nacked) leaves the job as
it was; the dispatcher publishes it later, so nothing accepted is lost. A message
can reach a worker before the confirm is recorded: the claim accepts `pending` and
`queued` alike, and a lost `-> queued` compare-and-set (zero rows) means the job
was already claimed, which is success.

The wire payload (the task's one argument) is
`{job_id, type, params, submitted_by, attempt, created_at, request_id, correlation_id}`;
the message headers (`message_headers`) carry `job_id`, `request_id`, `correlation_id`
and the attempt too, and on a retry or a replay the previous attempt's error code and
exception class, so that a message read in a DLQ peek or in Flower explains itself
without decoding the body. Never the error's text: it may hold what a handler saw.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from typing import Any

import structlog
from django.conf import settings
from kombu import Connection

from audit.services import Actor
from config.tracing import publish_span
from jobs.exceptions import TransitionRefusedError
from jobs.models import Job
from jobs.services import transition
from jobs.states import Status
from jobs.types import get_type

log = structlog.get_logger(__name__)
PUBLISHER = Actor.system("publisher")

_local = threading.local()
# After a failed publish, on_commit publishing pauses this long (per broker URL) and
# leaves new jobs `pending` for the dispatcher, so a dead broker costs one request one
# connect timeout, not every request.
BROKER_DOWN_BACKOFF_SECONDS = 5.0
_broker_down_until: dict[str, float] = {}


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


def _connection(timeout: float) -> Connection:
    """One broker connection per thread, reused across publishes, rebuilt after errors.

    Keyed by URL and timeout so that a test (or a reconfigured process) pointing
    BROKER_URL elsewhere gets a connection to the new place, and a request thread's
    short connect timeout is never a dispatcher's long one.
    """
    key = (settings.BROKER_URL, timeout)
    conn = getattr(_local, "conn", None)
    if conn is not None and getattr(_local, "key", None) != key:
        _drop_connection()
        conn = None
    if conn is None:
        conn = Connection(
            key[0], connect_timeout=timeout, transport_options={"confirm_publish": True}
        )
        _local.conn, _local.key = conn, key
    return conn


def _drop_connection() -> None:
    conn = getattr(_local, "conn", None)
    _local.conn = None
    if conn is not None:
        try:
            conn.release()
        except Exception:  # a broken connection may fail to close
            pass


def message_publish(*, job: Job, timeout: float | None = None) -> None:
    """Publish one job's message and wait for the broker's confirm.

    Raises on any failure: connection refused, an unroutable message (`mandatory`
    makes RabbitMQ return it, and py-amqp raises), a nack, a confirm timeout.
    `timeout` bounds the connect and the confirm (JOBOPS_PUBLISH_TIMEOUT_SECONDS).
    """
    timeout = timeout or settings.JOBOPS_PUBLISH_TIMEOUT_SECONDS
    from config.celery import app

    spec = get_type(job.type)
    assert spec is not None
    headers = message_headers(job)
    try:
        conn = _connection(timeout)
        # Fail fast (no sleeping between tries): the caller is an API request or the
        # dispatcher loop, and the job is safe in the database either way.
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=timeout)
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
        _drop_connection()
        raise


def job_publish(
    *,
    job_id: uuid.UUID | str,
    sources: tuple[str, ...] | None = None,
    timeout: float | None = None,
) -> bool:
    """Publish a `pending` (or due `retrying`) job; on confirm move it to `queued`.

    1. Read the job; anything not publishable (already queued, running, ended) is
       left alone and False returned.
    2. Publish with confirms + mandatory (raises on failure; the job is unchanged).
    3. Compare-and-set `-> queued`. Zero rows: a worker claimed it first (or it was
       cancelled meanwhile): the publish still succeeded.
    """
    sources = sources or (Status.PENDING, Status.RETRYING)
    job = Job.objects.filter(id=job_id, status__in=sources).first()
    if job is None:
        return False
    message_publish(job=job, timeout=timeout)
    try:
        transition(job_id=job.id, target=Status.QUEUED, sources=[job.status], actor=PUBLISHER)
    except TransitionRefusedError:
        pass
    return True


def job_publish_after_commit(job_id: uuid.UUID | str) -> None:
    """The `transaction.on_commit` hook of job_create: never raises into the API.

    A failure leaves the job `pending`; the dispatcher publishes it later.
    """
    url = settings.BROKER_URL
    if time.monotonic() < _broker_down_until.get(url, 0.0):
        # The broker failed moments ago: do not make every request wait for it again.
        log.info("job_publish_deferred", job_id=str(job_id), error="broker recently down")
        return
    try:
        # A request must not wait long on a slow or blackholed broker: the short
        # timeout leaves the job `pending` for the dispatcher instead.
        job_publish(
            job_id=job_id,
            sources=(Status.PENDING,),
            timeout=settings.JOBOPS_REQUEST_BROKER_TIMEOUT_SECONDS,
        )
    except Exception as exc:  # broker down must not fail the request
        _broker_down_until[url] = time.monotonic() + BROKER_DOWN_BACKOFF_SECONDS
        log.warning("job_publish_deferred", job_id=str(job_id), error=repr(exc))
    else:
        _broker_down_until.pop(url, None)
