"""Liveness of the processes that serve no HTTP: workers and dispatchers.

Each live process refreshes a key `heartbeat:<kind>:<host>:<pid>` of the key-value store
(core/kv.py: Redis, or PostgreSQL's UNLOGGED jobops_kv with JOBOPS_REDIS off) every
JOBOPS_PROCESS_HEARTBEAT_SECONDS (with the broker node it is connected to) with a
time-to-live of three intervals, so a process that hangs or dies disappears by itself.
That store is the right place: it is shared by every host, and losing it loses nothing
but this view (docs/operations/scaling.md: per-host state is limited to caches that can
be lost). `manage.py liveness` and the
`process_heartbeat_age_seconds` gauge read the keys.

Workers beat from a consumer bootstep on the worker's timer (`HeartbeatStep`), the
dispatcher from its loop (`beat("dispatcher")`).
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

import structlog
from celery import bootsteps
from django.conf import settings

from core.broker import broker_node
from core.kv import kv_key, kv_store
from jobs.domain.types import primary_queue_names

log = structlog.get_logger("jobs.liveness")


def _key(kind: str) -> str:
    return kv_key("heartbeat", kind, socket.gethostname(), os.getpid())


def beat(kind: str, queues: tuple[str, ...] = (), broker: str | None = None) -> None:
    """Record that this process of `kind` is alive, and the broker node it is connected
    to (host:port, None when it has no connection now); a store outage is logged, not
    raised."""
    interval = settings.JOBOPS_PROCESS_HEARTBEAT_SECONDS
    value = json.dumps({"at": round(time.time(), 3), "queues": list(queues), "broker": broker})
    try:
        kv_store().set_many({_key(kind): value}, ttl=max(1, round(interval * 3)))
    except Exception as exc:
        log.warning("heartbeat_failed", kind=kind, error=repr(exc))


def beat_end(kind: str) -> None:
    """A clean stop is not a missing beat: drop this process's key at once."""
    try:
        kv_store().delete(_key(kind))
    except Exception as exc:
        log.warning("heartbeat_end_failed", kind=kind, error=repr(exc))


# The kinds of process that run jobs: Celery workers, and the PostgreSQL executor's
# `manage.py run_worker` (a queue is served by either).
WORKER_KINDS = ("worker", "run_worker")


def workers_of(found: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The live processes of `found` that run jobs, of every kind."""
    return [w for kind in WORKER_KINDS for w in found.get(kind, [])]


def missing_processes(found: dict[str, list[dict[str, Any]]]) -> list[str]:
    """What has no live process: the dispatcher, or a primary queue without a worker."""
    missing = [] if found.get("dispatcher") else ["dispatcher"]
    served = {q for w in workers_of(found) for q in w["queues"]}
    return missing + [f"worker for queue {q}" for q in primary_queue_names() if q not in served]


def broker_nodes_detail() -> dict[str, Any]:
    """What /readyz adds to its detail (settings.JOBOPS_READY_DETAIL): the broker node
    each live worker and dispatcher is connected to, by the heartbeat it last wrote."""
    return {
        "broker_nodes": sorted(
            (
                {"kind": kind, "host": p["host"], "pid": p["pid"], "node": p["broker"]}
                for kind, processes in live_processes().items()
                for p in processes
            ),
            key=lambda p: (p["kind"], p["host"], p["pid"]),
        )
    }


def live_processes() -> dict[str, list[dict[str, Any]]]:
    """Every process that beat within its time-to-live, grouped by kind. Raises
    core.kv.KvUnavailable when the store does not answer."""
    prefix = kv_key("heartbeat", "")
    now = time.time()
    found: dict[str, list[dict[str, Any]]] = {}
    for key, value in sorted(kv_store().scan(prefix).items()):
        kind, host, pid = key[len(prefix) :].rsplit(":", 2)
        data = json.loads(value)
        found.setdefault(kind, []).append(
            {
                "host": host,
                "pid": int(pid),
                "age_seconds": round(now - float(data["at"]), 3),
                "queues": data["queues"],
                "broker": data.get("broker"),  # a process of an older release: None
            }
        )
    return found


class HeartbeatStep(bootsteps.StartStopStep):
    """A consumer bootstep: beat on the worker's timer while the consumer runs.

    A consumer step, not a worker step: when the broker connection is lost, Celery
    clears the timer of the consumer (`Consumer.on_close`), which cancelled a worker
    step's beat for good, and the worker vanished from liveness after its first
    reconnect. The consumer's steps start again after each reconnect, and so does the
    beat, with the node the new connection reached.
    """

    requires = ("celery.worker.consumer.connection:Connection",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.tref: Any = None
        # The queues it consumes, so liveness can tell which queue has no live worker.
        self.queues = tuple(sorted(c.app.amqp.queues.consume_from or c.app.amqp.queues))

    def start(self, c: Any) -> None:
        self.beat(c)
        self.tref = c.timer.call_repeatedly(
            settings.JOBOPS_PROCESS_HEARTBEAT_SECONDS, self.beat, (c,), priority=10
        )

    def beat(self, c: Any) -> None:
        # The consumer's connection: the node this worker receives its messages from.
        beat("worker", self.queues, broker_node(c.connection))

    def stop(self, c: Any) -> None:
        """A consumer restart (a reconnect): the beat starts again with the consumer."""
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None

    def shutdown(self, c: Any) -> None:
        self.stop(c)
        beat_end("worker")
