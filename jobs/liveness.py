"""Liveness of the processes that serve no HTTP: workers and dispatchers.

Each live process refreshes a Redis key `heartbeat:<kind>:<host>:<pid>` every
JOBOPS_PROCESS_HEARTBEAT_SECONDS (with the broker node it is connected to) with a
time-to-live of three intervals, so a process
that hangs or dies disappears by itself. Redis is the right place: it is shared by every
host, and losing it loses nothing but this view (docs/operations/scaling.md: per-host state is
limited to caches that can be lost). `manage.py liveness` and the
`process_heartbeat_age_seconds` gauge read the keys.

Workers beat from a bootstep on the worker's own timer (`HeartbeatStep`), the
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
from jobs.redis_client import redis_client, redis_key
from jobs.types import primary_queue_names

log = structlog.get_logger("jobs.liveness")


def _key(kind: str) -> str:
    return redis_key("heartbeat", kind, socket.gethostname(), os.getpid())


def beat(kind: str, queues: tuple[str, ...] = (), broker: str | None = None) -> None:
    """Record that this process of `kind` is alive, and the broker node it is connected
    to (host:port, None when it has no connection now); a Redis outage is logged, not
    raised."""
    interval = settings.JOBOPS_PROCESS_HEARTBEAT_SECONDS
    value = json.dumps({"at": round(time.time(), 3), "queues": list(queues), "broker": broker})
    try:
        redis_client().set(_key(kind), value, ex=max(1, round(interval * 3)))
    except Exception as exc:
        log.warning("heartbeat_failed", kind=kind, error=repr(exc))


def beat_end(kind: str) -> None:
    """A clean stop is not a missing beat: drop this process's key at once."""
    try:
        redis_client().delete(_key(kind))
    except Exception as exc:
        log.warning("heartbeat_end_failed", kind=kind, error=repr(exc))


def missing_processes(found: dict[str, list[dict[str, Any]]]) -> list[str]:
    """What has no live process: the dispatcher, or a primary queue without a worker."""
    missing = [] if found.get("dispatcher") else ["dispatcher"]
    served = {q for w in found.get("worker", []) for q in w["queues"]}
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
    """Every process that beat within its time-to-live, grouped by kind."""
    client = redis_client()
    prefix = redis_key("heartbeat", "")
    keys = list(client.scan_iter(match=f"{prefix}*", count=500))
    values: list[Any] = client.mget(keys) if keys else []  # type: ignore[assignment]
    now = time.time()
    found: dict[str, list[dict[str, Any]]] = {}
    for key, value in zip(keys, values, strict=True):
        if value is None:
            continue  # expired between the scan and the read
        kind, host, pid = key.decode()[len(prefix) :].rsplit(":", 2)
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
    """A worker bootstep: beat on the worker's timer while the consumer runs."""

    requires = ("celery.worker.components:Timer",)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.tref: Any = None
        # The queues it consumes, so liveness can tell which queue has no live worker.
        self.queues = tuple(sorted(worker.app.amqp.queues.consume_from or worker.app.amqp.queues))

    def start(self, worker: Any) -> None:
        self.beat(worker)
        self.tref = worker.timer.call_repeatedly(
            settings.JOBOPS_PROCESS_HEARTBEAT_SECONDS, self.beat, (worker,), priority=10
        )

    def beat(self, worker: Any) -> None:
        # The consumer's connection: the node this worker receives its messages from,
        # which moves to another node of a cluster when its node is lost.
        consumer = getattr(worker, "consumer", None)
        beat("worker", self.queues, broker_node(getattr(consumer, "connection", None)))

    def stop(self, worker: Any) -> None:
        if self.tref is not None:
            self.tref.cancel()
        beat_end("worker")
