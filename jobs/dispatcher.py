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

Beside the loop, a thread of the same process publishes new jobs the moment their
NOTIFY jobs_pending arrives (`dispatch_forever`).
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


def dispatch_once(*, steps: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """Run every step once; a failing step is logged and reported, never fatal."""
    report: dict[str, Any] = {}
    for name, path in steps or settings.JOBOPS_DISPATCHER_STEPS:
        _run_step(report, name, path)
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
    - New jobs are published by a thread of their own as soon as NOTIFY jobs_pending
      says one was created (DESIGN.md 3.5): a new job never waits for a step of the
      loop (the relay's confirm wait, a checkpoint). Both threads claim rows with
      SKIP LOCKED, as two dispatchers do.
    """
    stop = stop or threading.Event()
    log.info("dispatcher_started", interval=interval)
    ended = threading.Event()
    publisher = threading.Thread(
        target=_publish_on_notify, args=(stop, ended), name="publish-on-notify", daemon=True
    )
    publisher.start()
    try:
        while not stop.is_set():
            beat("dispatcher")
            report = dispatch_once()
            busy = any(isinstance(done, int) and done > 0 for done in report.values())
            stop.wait(min(BUSY_GAP_SECONDS, interval) if busy else interval)
    finally:
        ended.set()
        publisher.join(timeout=5)
    log.info("dispatcher_stopped")


def _publish_on_notify(stop: threading.Event, ended: threading.Event) -> None:
    """The publisher thread: wait for NOTIFY jobs_pending, publish the new jobs."""
    listener = PendingListener()
    try:
        while not (stop.is_set() or ended.is_set()):
            try:
                if listener.wait(until=time.monotonic() + STOP_CHECK_SECONDS, stop=ended):
                    _run_step({}, *PUBLISH_STEPS[0])
            except Exception as exc:  # never die quietly: the loop alone would be slower
                log.error("dispatcher_publisher_failed", error=repr(exc))
                listener.close()
                ended.wait(STOP_CHECK_SECONDS)
    finally:
        listener.close()
        connection.close()  # this thread's own database connection


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

    def wait(self, *, until: float, stop: threading.Event) -> bool:
        """Return True at the first notification (after draining the others); False at
        `until` or soon after `stop` is set."""
        while not stop.is_set():
            remaining = until - time.monotonic()
            if remaining <= 0:
                return False
            conn = self._connect()
            if conn is None:
                stop.wait(min(remaining, STOP_CHECK_SECONDS))
                continue
            try:
                if self._notified(conn, timeout=min(remaining, STOP_CHECK_SECONDS)):
                    # One wake-up for every job created meanwhile: drain the rest.
                    while self._notified(conn, timeout=DRAIN_SECONDS):
                        pass
                    return True
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
