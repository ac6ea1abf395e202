"""The Celery app (docs/architecture.md#rabbitmq-topology-and-dead-letters).

Everything comes from settings, read lazily (this module is imported by
`config/__init__.py`, before Django has loaded its settings):

- `task_queues` are the very `Queue` objects `setup_topology` declares
  (`jobs.integrations.topology.job_queues()`), and Celery may not invent others
  (`task_create_missing_queues=False`), so a worker never meets a queue whose
  arguments differ (RabbitMQ would answer 406 and the worker would die).
- `task_routes` map `jobs.<type>` to the type's queue on `jobs.direct`, routing key =
  queue name, from the one types table.
- Late acks, reject on worker loss, and failures NOT acked: a task that fails is
  rejected without requeue so that the broker dead-letters its copy. Celery 5.7
  splits `task_acks_on_failure_or_timeout`; the version is pinned to 5.5.
- Publisher confirms; our publisher adds `mandatory` (jobs/integrations/publisher.py).
- Per-type soft/hard time limits as task annotations.

Run the two worker groups of the Procfile: long queues (model, cam, sim, report)
with prefetch multiplier 1 under prefork, light queues (default, erp) with 3 under the
threads pool (their claims and ends batched across tasks, the hard time limits enforced by the
execution core: jobs.tasks tells the adapter which pool runs it). A worker refuses to
start when `(multiplier - 1) * time_limit >= consumer_timeout / 2` for a queue it
consumes: a reserved message could otherwise wait past RabbitMQ's consumer_timeout.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from celery import Celery
from celery.concurrency.thread import TaskPool as ThreadsPool
from celery.signals import worker_init, worker_process_init, worker_process_shutdown
from celery.utils.log import get_logger
from celery.worker.consumer import Consumer
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from kombu.utils.encoding import safe_repr
from prometheus_client import multiprocess
from vine import promise

from audit.db_roles import refuse_privileged_database_role
from core.json import json_problem
from core.metrics import metrics_serve
from core.metrics_dir import multiprocess_dir_prune
from core.tracing import configure_tracing, flush_tracing
from jobs.domain.types import all_types
from jobs.integrations.topology import JOBS_EXCHANGE, job_queues

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("jobops", include=["jobs.tasks"])
logger = get_logger("jobops.consumer")
# Each worker refreshes a liveness key (jobs/integrations/liveness.py, `manage.py liveness`).
app.steps["consumer"].add("jobs.integrations.liveness:HeartbeatStep")


class JobopsConsumer(Consumer):
    """Celery's consumer, hardened against messages no publisher of ours would send.

    - Every message is decoded and checked in the consumer, before Celery hands it to a
      pool child (`message_problem`): a body nested a few hundred levels deep made the
      main process raise RecursionError while pickling it for the child, and the worker
      exited ("Unrecoverable error"); redelivery repeated it. Such a message is rejected
      without requeue, so RabbitMQ dead-letters it to `<q>_dlq` and the watcher records
      it (docs/architecture.md#dead-letters).
    - A body that cannot be decoded is rejected the same way; Celery's default acks it
      away, and the message was lost.
    - Under the threads pool, a task's late ack wakes the event loop (`_wake_hub`):
      Celery hands the ack to the loop's thread (`hub.call_soon`) without waking it, so
      once the prefetch window was full the acks waited for the loop's next timer, up
      to ten seconds, and so did the next messages.
    - No native delayed delivery step: with quorum queues Celery 5.5 declares
      `celery_delayed_*` exchanges and queues and binds our queues to them. jobops uses
      no countdown/ETA (retries wait in the database, docs/architecture.md) and Celery must
      declare nothing beyond our topology.
    """

    class Blueprint(Consumer.Blueprint):
        default_steps = [
            s for s in Consumer.Blueprint.default_steps if not s.endswith("DelayedDelivery")
        ]

    def create_task_handler(self, promise: Any = promise) -> Any:
        on_task_received = super().create_task_handler(promise)
        if self.hub is not None and isinstance(self.pool, ThreadsPool):
            _wake_hub(self.hub)

        def on_checked_task_received(message: Any) -> Any:
            problem = message_problem(message)
            if problem is None:
                return on_task_received(message)
            logger.error(
                "Rejecting a message to its dead-letter queue: %s (headers %s)",
                problem,
                safe_repr(message.headers)[:500],
            )
            message.reject_log_error(logger, self.connection_errors, requeue=False)
            return None

        return on_checked_task_received

    def on_decode_error(self, message: Any, exc: BaseException) -> None:
        logger.error("Rejecting an undecodable message to its dead-letter queue: %r", exc)
        message.reject_log_error(logger, self.connection_errors, requeue=False)


def _wake_hub(hub: Any) -> None:
    """Make `hub.call_soon` from another thread (a pool thread's ack) wake the loop: a
    pipe the loop reads, written once per call from outside the loop's thread. Called
    in the loop's thread, as the loop starts (again after a reconnection: once)."""
    if getattr(hub, "_jobops_waker", None) is not None:
        return
    readable, writable = os.pipe()
    os.set_blocking(readable, False)
    os.set_blocking(writable, False)
    hub._jobops_waker = writable
    loop_thread = threading.get_ident()

    def drained() -> None:
        try:
            while os.read(readable, 4096):
                pass
        except BlockingIOError:
            pass

    hub.add_reader(readable, drained)
    call_soon = hub.call_soon

    def call_soon_and_wake(callback: Any, *args: Any) -> Any:
        queued = call_soon(callback, *args)
        if threading.get_ident() != loop_thread:
            try:
                os.write(writable, b"\0")
            except BlockingIOError:  # the pipe is full: the loop has wake-ups waiting
                pass
        return queued

    hub.call_soon = call_soon_and_wake
    # And should a wake-up ever be missed, an ack waits half a second, not a timer's ten.
    hub.call_repeatedly(HUB_WAKE_SECONDS, _nothing)


HUB_WAKE_SECONDS = 0.5


def _nothing() -> None:
    """A timer's entry that only bounds how long the event loop sleeps."""


JOB_TASK_PREFIX = "jobs."


def message_problem(message: Any) -> str | None:
    """Why a job message must not reach a pool child, or None.

    A job message is Celery protocol 2 JSON, `[[payload], {}, {...}]` with one object
    argument, no deeper than the API would ever accept (JOBOPS_MAX_JSON_DEPTH for the
    params inside the payload and its envelope).
    """

    if not isinstance(message.headers, dict) or "task" not in message.headers:
        return None  # Celery's own path rejects unknown formats without requeue
    try:
        body = message.decode()
    except Exception as exc:  # undecodable, disallowed content type, or too deep to parse
        return f"undecodable body ({type(exc).__name__})"
    problem = json_problem(body, max_depth=settings.JOBOPS_MAX_JSON_DEPTH + 4)
    if problem:
        return f"body {problem}"
    if not str(message.headers["task"]).startswith(JOB_TASK_PREFIX):
        return None  # another app's task on this consumer (the raw Celery benchmark)
    if not (
        isinstance(body, list)
        and len(body) == 3
        and isinstance(body[0], list)
        and len(body[0]) == 1
        and isinstance(body[0][0], dict)
    ):
        return "not a job message ([[payload], {}, {}] expected)"
    return None


def celery_config() -> dict[str, Any]:
    """The whole Celery configuration, built from Django settings on first use."""

    types = all_types().values()
    return {
        "broker_url": settings.BROKER_URL,
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {"confirm_publish": True},
        "result_backend": "django-db",
        "result_extended": True,
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_serializer": "json",
        "task_queues": job_queues(),
        "task_create_missing_queues": False,
        "task_default_queue": "default",
        "task_default_exchange": JOBS_EXCHANGE.name,
        "task_default_exchange_type": "direct",
        "task_default_routing_key": "default",
        "task_routes": {
            t.task_name: {"queue": t.queue, "exchange": JOBS_EXCHANGE.name, "routing_key": t.queue}
            for t in types
        },
        "task_annotations": {
            t.task_name: {"soft_time_limit": t.soft_time_limit, "time_limit": t.time_limit}
            for t in types
        },
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": False,
        # Retries are the dispatcher's job (docs/architecture.md), never Celery countdown/ETA.
        "task_publish_retry": False,
        "worker_prefetch_multiplier": 1,
        "worker_consumer": "config.celery:JobopsConsumer",
        "worker_hijack_root_logger": False,
        "worker_send_task_events": False,
        "timezone": "UTC",
    }


app.add_defaults(celery_config)


def prefetch_problems(*, multiplier: int, queues: list[str], consumer_timeout: int) -> list[str]:
    """Queues whose reserved messages could wait past consumer_timeout / 2."""

    problems = []
    for t in all_types().values():
        if t.queue in queues and (multiplier - 1) * t.time_limit >= consumer_timeout / 2:
            problems.append(
                f"queue {t.queue} (type {t.name}): ({multiplier} - 1) x {t.time_limit} s "
                f">= consumer_timeout {consumer_timeout} s / 2"
            )
    return problems


@worker_init.connect
def _refuse_unsafe_prefetch(sender: Any = None, **_: Any) -> None:
    queues = list(sender.app.amqp.queues.consume_from or sender.app.amqp.queues)
    problems = prefetch_problems(
        multiplier=int(sender.prefetch_multiplier),
        queues=queues,
        consumer_timeout=settings.JOBOPS_CONSUMER_TIMEOUT_SECONDS,
    )
    if problems:
        # Celery logs and swallows Exceptions raised by signal receivers; SystemExit is
        # not an Exception, so the worker really stops.
        raise SystemExit(
            "refusing to start: prefetch multiplier too high for these queues: "
            + "; ".join(problems)
            + " (use --prefetch-multiplier 1 for long queues)"
        )


@worker_process_init.connect
def _trace_worker_process(**_: Any) -> None:
    # In each pool child: the SDK's export thread does not survive the fork.

    configure_tracing("worker")


@worker_process_shutdown.connect
def _flush_worker_traces(pid: int | None = None, **_: Any) -> None:
    flush_tracing()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.mark_process_dead(pid or os.getpid())  # its live gauges stop counting


@worker_init.connect
def _refuse_privileged_database_role(**_: Any) -> None:
    try:
        refuse_privileged_database_role()
    except ImproperlyConfigured as exc:
        # Celery logs and swallows Exceptions raised by signal receivers (the worker
        # then started as a superuser anyway); SystemExit really stops it.
        raise SystemExit(str(exc)) from None


@worker_init.connect
def _serve_worker_metrics(**_: Any) -> None:
    """The worker group's exporter (JOBOPS_METRICS_PORT), in the main process. Pool
    children count too only through PROMETHEUS_MULTIPROC_DIR
    (docs/operations/observability.md#metrics)."""

    multiprocess_dir_prune()
    metrics_serve()
