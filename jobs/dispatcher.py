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

import psycopg
import structlog
from django.conf import settings
from django.db import close_old_connections, connection
from django.utils.module_loading import import_string

from jobs import sql
from jobs.liveness import beat

log = structlog.get_logger("jobs.dispatcher")


def dispatch_once(
    *,
    steps: list[tuple[str, str]] | None = None,
    between: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """Run every step once; a failing step is logged and reported, never fatal.
    `between` runs after each step (the loop publishes what was created meanwhile)."""
    report: dict[str, Any] = {}
    for name, path in steps or settings.JOBOPS_DISPATCHER_STEPS:
        _run_step(report, name, path)
        if between is not None:
            between()
    return report


def _run_step(report: dict[str, Any], name: str, path: str) -> None:
    if not connection.in_atomic_block:
        close_old_connections()  # a database restart must not wedge the loop
    try:
        step: Callable[[], Any] = import_string(path)
        report[name] = step()
    except Exception as exc:
        log.error("dispatcher_step_failed", step=name, error=repr(exc))
        report[name] = {"error": repr(exc)}


def dispatch_forever(*, interval: float, stop: threading.Event | None = None) -> None:
    """Run the loop until `stop`.

    - Every step at least every `interval` seconds; again after BUSY_GAP_SECONDS while
      the last loop found work (a backlog drains at speed, an idle dispatcher sleeps).
    - The publish step as soon as NOTIFY jobs_pending says a job was created (DESIGN.md
      3.5), also between the other steps of a loop: a new job waits for at most one
      step, not for the loop.
    """
    stop = stop or threading.Event()
    log.info("dispatcher_started", interval=interval)
    listener = PendingListener()

    def publish_if_notified() -> None:
        if listener.notified():
            _run_step({}, *PUBLISH_STEPS[0])

    next_full = 0.0
    while not stop.is_set():
        if time.monotonic() >= next_full:
            beat("dispatcher")
            report = dispatch_once(between=publish_if_notified)
            busy = any(isinstance(done, int) and done > 0 for done in report.values())
            next_full = time.monotonic() + (min(BUSY_GAP_SECONDS, interval) if busy else interval)
        else:
            dispatch_once(steps=PUBLISH_STEPS)
        listener.wait(until=next_full, stop=stop)
    listener.close()
    log.info("dispatcher_stopped")


# What a NOTIFY jobs_pending calls for: the new jobs, not the retries (those come due
# by the clock and the loop's own publish step finds them).
PUBLISH_STEPS = [("publish", "jobs.services.publishing.publish_pending_once")]
# Between two loops that found work. Under a steady stream of new jobs the relay always
# has events, so a loop without this gap would run every step back to back (reaper,
# checkpoints, broker depths, watcher) and take the CPU the API needs; new jobs are
# published on their NOTIFY meanwhile, and a backlog still drains a batch per loop.
BUSY_GAP_SECONDS = 0.05
# How often a sleeping dispatcher looks at `stop` while it waits for a notification.
STOP_CHECK_SECONDS = 0.25
# How long to wait for the notifications that came with the first one.
DRAIN_SECONDS = 0.001


class PendingListener:
    """A connection of its own that LISTENs on jobs_pending (jobs.sql.PENDING_CHANNEL).

    Django's connection cannot wait for notifications while it also runs the steps, so
    this one only listens. Without it (the database away, LISTEN refused) the loop
    falls back to its interval: slower, never wrong, since every step polls the tables.
    """

    def __init__(self) -> None:
        self.connection: psycopg.Connection[Any] | None = None

    def _connect(self) -> psycopg.Connection[Any] | None:
        if self.connection is None or self.connection.closed:
            try:
                params = connection.get_connection_params()
                self.connection = psycopg.connect(**params, autocommit=True)
                self.connection.execute(f"LISTEN {sql.PENDING_CHANNEL}")
                log.info("dispatcher_listening", channel=sql.PENDING_CHANNEL)
            except psycopg.Error as exc:
                log.warning("dispatcher_listen_failed", error=repr(exc))
                self.close()
        return self.connection

    def wait(self, *, until: float, stop: threading.Event) -> None:
        """Return at the first notification (after draining the others), at `until`, or
        soon after `stop` is set."""
        while not stop.is_set():
            remaining = until - time.monotonic()
            if remaining <= 0:
                return
            conn = self._connect()
            if conn is None:
                stop.wait(min(remaining, STOP_CHECK_SECONDS))
                continue
            try:
                if self._notified(conn, timeout=min(remaining, STOP_CHECK_SECONDS)):
                    # One wake-up for every job created meanwhile: drain the rest.
                    while self._notified(conn, timeout=DRAIN_SECONDS):
                        pass
                    return
            except psycopg.Error as exc:
                log.warning("dispatcher_listen_failed", error=repr(exc))
                self.close()

    def notified(self) -> bool:
        """Whether a job was created since the last look (without waiting)."""
        conn = self._connect()
        if conn is None:
            return False
        try:
            woken = self._notified(conn, timeout=DRAIN_SECONDS)
            while woken and self._notified(conn, timeout=DRAIN_SECONDS):
                pass
            return woken
        except psycopg.Error as exc:
            log.warning("dispatcher_listen_failed", error=repr(exc))
            self.close()
            return False

    @staticmethod
    def _notified(conn: psycopg.Connection[Any], *, timeout: float) -> bool:
        # Each call runs a notifies() generator to its end: a suspended one holds the
        # connection's lock, and a second one would wait for it forever.
        return any(True for _ in conn.notifies(timeout=timeout, stop_after=1))

    def close(self) -> None:
        if self.connection is not None:
            try:
                self.connection.close()
            except psycopg.Error:
                pass
        self.connection = None
