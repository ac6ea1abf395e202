"""The dispatcher loop (docs/architecture.md): one process, safe to run on several hosts.

Each loop runs the steps of `settings.JOBOPS_DISPATCHER_STEPS` in order; a step that
fails (broker down, a missing module, a bug) is logged, counted and shown on the
dashboard until it succeeds again (jobs/processes/step_failures.py), and the loop goes on with
the next one:

1. publish (`jobs.services.publishing`): `pending` jobs older than
   JOBOPS_DISPATCH_PENDING_AFTER_SECONDS and due `retrying` jobs, each claimed with
   `FOR UPDATE SKIP LOCKED` while it is published and moved to `queued` on the broker's
   confirm (two dispatchers never publish the same row at once, and the worker's claim
   fences any duplicate anyway);
2. reap (`jobs.services.reaper`): `running` jobs whose lock went stale -> `retrying`
   now (audit `reclaimed`), or `failed` + a `worker_lost` dead letter once their
   attempts are used up;
3. release_keys (`jobs.services.keys`): idempotency keys past their TTL, in batches;
4. scheduled (`jobs.services.scheduling`): scheduled jobs whose run_at has come ->
   `pending`; its result's `wake_in` makes the loop run it again no later than the
   next run_at (wake_in); schedules (`jobs.services.schedules`): recurring fires;
5. the steps other modules own: the event outbox relay, audit checkpoints, the queue
   depths cache for backpressure, the dead-letter watcher.

Without a broker (JOBOPS_BROKER off) the RabbitMQ steps are left out or replaced by
their database form (settings.JOBOPS_BROKERLESS_STEPS), and nothing LISTENs for new
jobs to publish: the PostgreSQL executor's workers take them from the table.

One process can do it all (`--role all`), or the publishing can run in a process of its
own (`--role publish` beside `--role maintain`, as the Procfile does): see ROLES.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import psycopg
import structlog
from django.conf import settings
from django.db import close_old_connections, connection
from django.utils.module_loading import import_string

from core.broker import thread_broker_node
from jobs.integrations import metrics
from jobs.integrations.liveness import beat, beat_end
from jobs.processes.step_failures import step_failed, step_succeeded
from jobs.queries import PENDING_CHANNEL, QUERIES

log = structlog.get_logger("jobs.dispatcher")


def dispatch_once(
    *,
    steps: list[tuple[str, str]] | None = None,
    between: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """Run every step once; a failing step is logged and reported, never fatal.
    `between` runs after each step (the loop publishes what was created meanwhile)."""
    report: dict[str, Any] = {}
    for name, path in role_steps("all") if steps is None else steps:
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
        # Counted, and named on the dashboard until the step succeeds again.
        step_failed(name, exc)
    else:
        step_succeeded(name)
    finally:
        metrics.DISPATCHER_STEP_RUNS.labels(step=name).inc()


def dispatch_forever(
    *, interval: float, stop: threading.Event | None = None, role: str = "all"
) -> None:
    """Run the steps of `role` (ROLES) until `stop`.

    - Each step on its own clock: again after BUSY_GAP_SECONDS when it found work (a
      backlog drains at speed), else after `interval`. A busy relay does not make the
      reaper, the checkpoint and the watcher query twenty times a second.
    - The publish step as soon as NOTIFY jobs_pending says a job was created,
      also between the other steps: a new job waits for at most one step, or for
      PUBLISH_GAP_SECONDS when a pass has just run (its batch goes out at the gap's end).
    """
    stop = stop or threading.Event()
    steps, spec = role_steps(role), ROLES[role]
    log.info("dispatcher_started", interval=interval, role=role)
    on_notify = NotifiedPublishing() if spec.listens and settings.JOBOPS_BROKER else None
    due = dict.fromkeys((name for name, _path in steps), 0.0)
    next_beat = 0.0
    while not stop.is_set():
        now = time.monotonic()
        if now >= next_beat:
            beat(spec.kind, broker=thread_broker_node())
            next_beat = now + min(interval, settings.JOBOPS_PROCESS_HEARTBEAT_SECONDS)
        ready = [(name, path) for name, path in steps if due[name] <= now]
        if ready:
            between = on_notify.between if on_notify is not None else None
            report = dispatch_once(steps=ready, between=between)
            metrics.DISPATCHER_PASSES.inc()
            for name, result in report.items():
                gap = min(BUSY_GAP_SECONDS, interval) if found_work(result) else interval
                due[name] = time.monotonic() + min(gap, wake_in(result, default=gap))
        until = min(min(due.values()), next_beat)
        if on_notify is not None:
            on_notify.publish()
            on_notify.wait(until=until, stop=stop)
        else:
            stop.wait(max(0.0, until - time.monotonic()))
    if on_notify is not None:
        on_notify.listener.close()
    beat_end(spec.kind)
    log.info("dispatcher_stopped", role=role)


def role_steps(role: str) -> list[tuple[str, str]]:
    """The steps `run_dispatcher --role <role>` runs on its clock (without a broker:
    those that need none, settings.JOBOPS_BROKERLESS_STEPS)."""
    spec = ROLES[role]
    steps = settings.JOBOPS_DISPATCHER_STEPS if spec.steps is None else spec.steps
    chosen = [(name, spec.replace.get(name, path)) for name, path in steps]
    if settings.JOBOPS_BROKER:
        return chosen
    brokerless = settings.JOBOPS_BROKERLESS_STEPS
    return [
        (name, brokerless.get(name, path) or "")
        for name, path in chosen
        if name not in brokerless or brokerless[name] is not None
    ]


def wake_in(result: Any, *, default: float) -> float:
    """When a step asks to run again, at the latest: a result's `wake_in` seconds (the
    scheduled step: until the next run_at), else `default`."""
    if isinstance(result, dict) and isinstance(result.get("wake_in"), int | float):
        return max(0.0, float(result["wake_in"]))
    return default


def found_work(result: Any) -> bool:
    """Whether a step's result says it did something (a count, or a dict of counts),
    so that it may have more to do at once."""
    if isinstance(result, dict):
        return any(found_work(value) for value in result.values())
    return isinstance(result, int) and not isinstance(result, bool) and result > 0


# What a NOTIFY jobs_pending calls for: the new jobs, not the retries (those come due
# by the clock and the loop's own publish step finds them).
PUBLISH_STEPS = [("publish", "jobs.services.publishing.publish_pending_once")]
OVERDUE_PUBLISH = "jobs.services.publishing.publish_overdue_once"


class Role(NamedTuple):
    """What `run_dispatcher --role <name>` runs."""

    steps: list[tuple[str, str]] | None  # the loop's steps; None: settings' steps
    listens: bool  # LISTENs and publishes on NOTIFY jobs_pending
    kind: str  # its heartbeat's kind (jobs.integrations.liveness)
    replace: dict[str, str] = {}  # step name -> the path this role runs instead


# - all: one process does everything (the default, enough for most deployments).
# - publish: only publishing, so that a new job never waits behind a long step of the
#   loop (an outbox batch under load takes tens of milliseconds): submit -> start.
# - maintain: every step on its clock and no LISTEN; its publish step takes the pending
#   jobs no publisher took within a second (none runs, or it is down), and retries.
ROLES: dict[str, Role] = {
    "all": Role(None, listens=True, kind="dispatcher"),
    "publish": Role(
        [("publish", "jobs.services.publishing.publish_due_once")],
        listens=True,
        kind="publisher",
    ),
    "maintain": Role(None, listens=False, kind="dispatcher", replace={"publish": OVERDUE_PUBLISH}),
}
# Between two runs of a step that found work: under a steady stream of new jobs the
# relay always has events, and without a gap it would run back to back and take the
# CPU the API needs; new jobs are published on their NOTIFY meanwhile, and a backlog
# still drains a batch per run.
BUSY_GAP_SECONDS = 0.05
# At most one publish pass per this gap on NOTIFY (NotifiedPublishing): 50 passes a
# second at most, whatever the rate of creation, for at most 20 ms more latency (a job
# created after an idle gap goes out at once).
PUBLISH_GAP_SECONDS = 0.02
# How often a sleeping dispatcher looks at `stop` while it waits for a notification.
STOP_CHECK_SECONDS = 0.25
# How long to wait for the notifications that came with the first one.
DRAIN_SECONDS = 0.001


class NotifiedPublishing:
    """Publishing on NOTIFY jobs_pending: at once, but at most one pass per
    PUBLISH_GAP_SECONDS. A pass has a fixed cost (the claim, the confirm wait, the
    mark, their audit and events); under a stream of creations the jobs created during
    the gap go out together in one confirmed batch, and a job waits at most the gap."""

    def __init__(self) -> None:
        self.listener = PendingListener()
        self.owed = False  # a notification no pass has answered yet
        self.last = -PUBLISH_GAP_SECONDS

    def publish(self) -> None:
        """Run the pass if one is owed and the gap since the last one has passed. The
        notifications that came meanwhile are taken first: this pass answers them."""
        if self.owed and time.monotonic() - self.last >= PUBLISH_GAP_SECONDS:
            self.listener.notified()
            self.owed, self.last = False, time.monotonic()
            _run_step({}, *PUBLISH_STEPS[0])

    def between(self) -> None:
        """Between two steps of the loop: take a notification, publish if due."""
        if self.listener.notified():
            self.owed = True
        self.publish()

    def wait(self, *, until: float, stop: threading.Event) -> None:
        """Until a notification or `until`; while a pass is owed, only until the gap
        has passed (the jobs created meanwhile need no wake-up of their own)."""
        if self.owed:
            stop.wait(max(0.0, min(until, self.last + PUBLISH_GAP_SECONDS) - time.monotonic()))
        elif self.listener.wait(until=until, stop=stop):
            self.owed = True


class PendingListener:
    """A connection of its own that LISTENs on jobs_pending (jobs.queries.PENDING_CHANNEL).

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
                self.connection.execute(QUERIES["listen_pending"])
                log.info("dispatcher_listening", channel=PENDING_CHANNEL)
            except psycopg.Error as exc:
                log.warning("dispatcher_listen_failed", error=repr(exc))
                self.close()
        return self.connection

    def wait(self, *, until: float, stop: threading.Event) -> bool:
        """Return True at the first notification (after draining the others), False at
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
