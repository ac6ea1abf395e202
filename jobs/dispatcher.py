"""The dispatcher loop (DESIGN.md 3.5): one process, safe to run on several hosts.

Each loop runs the steps of `settings.JOBOPS_DISPATCHER_STEPS` in order; a step that
fails (broker down, a missing module, a bug) is logged and the loop goes on with the
next one:

1. publish (`jobs.services.publishing`): `pending` jobs older than
   JOBOPS_DISPATCH_PENDING_AFTER_SECONDS and due `retrying` jobs, each claimed with
   `FOR UPDATE SKIP LOCKED` while it is published and moved to `queued` on the broker's
   confirm (two dispatchers never publish the same row at once, and the worker's claim
   fences any duplicate anyway);
2. reap (`jobs.services.reaper`): `running` jobs whose lock went stale -> `retrying`
   now (audit `reclaimed`), or `failed` + a `worker_lost` dead letter once their
   attempts are used up;
3. the steps other modules own: the event outbox relay, audit checkpoints, the queue
   depths cache for backpressure, the dead-letter watcher.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import structlog
from django.conf import settings
from django.db import close_old_connections, connection
from django.utils.module_loading import import_string

from jobs.liveness import beat

log = structlog.get_logger("jobs.dispatcher")


def dispatch_once(*, steps: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """Run every step once; a failing step is logged and reported, never fatal."""
    report: dict[str, Any] = {}
    for name, path in steps or settings.JOBOPS_DISPATCHER_STEPS:
        if not connection.in_atomic_block:
            close_old_connections()  # a database restart must not wedge the loop
        try:
            step: Callable[[], Any] = import_string(path)
            report[name] = step()
        except Exception as exc:
            log.error("dispatcher_step_failed", step=name, error=repr(exc))
            report[name] = {"error": repr(exc)}
    return report


def dispatch_forever(*, interval: float, stop: threading.Event | None = None) -> None:
    stop = stop or threading.Event()
    log.info("dispatcher_started", interval=interval)
    while not stop.is_set():
        started = time.monotonic()
        beat("dispatcher")
        dispatch_once()
        stop.wait(max(0.0, interval - (time.monotonic() - started)))
    log.info("dispatcher_stopped")
