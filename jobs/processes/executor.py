"""The postgres executor (docs/postgres-executor.md): `manage.py run_worker`.

A queue configured `JOBOPS_EXECUTOR_<QUEUE>=postgres` never goes through RabbitMQ. One
`Host` per run_worker process runs its jobs as a pipeline: each stage below is a thread
of its own with its own database connection (Django's are per thread), so that a claim's
commit, a window of completions' commit and the runners overlap instead of taking turns.

1. Claim (the claimer thread): due jobs in one transaction (`jobs.services.jobs_claim`:
   a SKIP LOCKED select, then one jobs_claim_polled call claiming them all, each with its `started`
   entry) into a short local buffer the runners take from, so that a runner never waits
   for a claim's round trip. At most `concurrency * JOBOPS_WORKER_PREFETCH` jobs are in
   hand (buffered or running), and only as many wait in the buffer as the runners will
   start within BUFFER_HORIZON_SECONDS at the recent run time: a claimed job is
   `running` in the database (its `started` entry written) while it waits, so the wait
   must stay short; jobs of a second or more are never claimed ahead. A claim that
   found all it asked for claims again as soon as there is room for a batch; otherwise
   the claimer sleeps on its LISTEN connection until NOTIFY jobs_pending (a job created,
   replayed, resumed) wakes it, or JOBOPS_WORKER_POLL_SECONDS pass, or a retry comes due.
2. Run (one thread per runner): takes the next buffered job and runs it in a child
   process (the default) or in the thread itself (JOBOPS_WORKER_POOL=threads, for
   I/O-bound and short types), through the execution core's `run_claimed`
   (jobs.execution), as a Celery worker does: the handler contract, JobContext, the
   error taxonomy and backoff are shared. A process runner's soft time limit raises
   SoftTimeLimitExceeded in the handler (the core's timer, with the class this adapter
   gives it: jobs.execution.limits); past the hard limit the host kills it (a thread
   cannot be killed: it is left behind and a new one takes its place) and stops beating
   for the job, whose lock goes stale: the reaper reclaims it, as for a worker lost.
3. Complete (the completer thread): the runs' ends are written in windows, when
   COMPLETE_BATCH have come or COMPLETE_WINDOW_SECONDS after the window's first, by the
   core's completer (`jobs.execution.complete`, a Celery worker's too): one statement
   per outcome, each job fenced by the host's lock holder and its own attempt. A job
   whose fence failed is reported lost (logged, jobs_lost_total); the others are
   unaffected.
4. Heartbeat (the core's heartbeat loop, `jobs.execution.heartbeat`): one statement for
   the jobs the host holds, buffered ones included, each JOBOPS_HEARTBEAT_SECONDS after
   its claim (those due within half a heartbeat together); a job no longer held
   (reclaimed) is lost: the host stops beating for it and its runner's writes are
   refused by their fence.
5. SIGTERM: stop claiming, let the runners finish what they hold (buffered jobs too: they
   are claimed) for JOBOPS_WORKER_GRACE_SECONDS, write their ends, then exit; jobs not
   finished then are left to the reaper, as are all of a host killed outright.
6. A host killed outright (`kill -9` of its main process alone) takes its child
   processes with it: each child watches its host (`_watch_host`, jobs.processes.executor_runners)
   and ends within about a second of its death, its handler interrupted; its job is the
   reaper's.
"""

from __future__ import annotations

import gc
import math
import queue
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

import structlog
from django.conf import settings
from django.db import close_old_connections, connection

from jobs.domain.types import get_type
from jobs.execution.complete import (
    COMPLETE_BATCH,
    COMPLETE_WINDOW_SECONDS,
    End,
    attempt_fields,
    complete_windows,
    write_ends,
)
from jobs.execution.context import worker_identity
from jobs.execution.heartbeat import HeartbeatLoop
from jobs.execution.run import DB_DOWN_ERRORS
from jobs.integrations import metrics
from jobs.integrations.liveness import beat, beat_end
from jobs.models import Job
from jobs.processes.dispatcher import PendingListener
from jobs.processes.executor_runners import (
    DEFERRED,
    HostGone,
    fork_runner,
    job_message,
    run_claimed,
    runner_process,
)
from jobs.queries import QUERIES
from jobs.services import Fence, Finish, jobs_claim
from jobs.services.connectors import blocked_types

# The names this module held before the runners moved to jobs.processes.executor_runners.
__all__ = [
    "COMPLETE_BATCH",
    "COMPLETE_WINDOW_SECONDS",
    "DEFERRED",
    "Host",
    "HostGone",
    "job_message",
    "run_claimed",
    "run_worker",
    "runner_process",
]

log = structlog.get_logger("jobs.executor")

# A claimed job waits in the buffer at most about this long at the recent run time: it
# is `running`, with its `started` entry, while it waits (docs/postgres-executor.md).
BUFFER_HORIZON_SECONDS = 0.05
# The weight of the newest run in the mean run time that sizes the buffer.
RUN_TIME_WEIGHT = 0.2
# How often the host's own thread looks at the stop flag, the hard time limits and its
# liveness beat.
SUPERVISE_SECONDS = 0.1
# The liveness kind run_worker hosts beat as (jobs.integrations.liveness, `manage.py liveness`).
LIVENESS_KIND = "run_worker"


# --- what the host holds ---------------------------------------------------------------


@dataclass(eq=False)
class Held:
    """A job the host claimed, from its claim until its end is written (or it is lost)."""

    job: Job
    fence: Fence
    deadline: float = 0.0  # its hard time limit (monotonic), once a runner runs it
    lost: bool = False  # reclaimed from under the host: its end is not written
    left: bool = False  # left to the reaper (hard time limit, runner died, shutdown)
    ending: bool = False  # its end is on its way to the completer
    host: Host | None = None  # whose heartbeat loop beats for it

    # -- a member of the host's heartbeat loop (jobs.execution.heartbeat.Beating)
    @property
    def job_id(self) -> uuid.UUID:
        return self.job.id

    @property
    def log(self) -> Any:
        return log.bind(job_id=str(self.job.id))

    def beat_held(self, cancel_requested: bool) -> None:
        """Nothing to pass on: the runner's JobContext reads the cancel flag itself."""

    def beat_lost(self) -> None:
        if self.host is not None:
            self.host.lost(self)


@dataclass(eq=False)
class Slot:
    """One runner: a thread of the host that takes buffered jobs and runs each in its
    child process (`processes`) or in itself (`threads`)."""

    host: Host
    number: int
    thread: threading.Thread = field(init=False)
    process: Any = None
    conn: Connection | None = None
    held: Held | None = None  # the job it runs now
    abandoned: bool = False  # a thread left behind past its hard time limit

    def __post_init__(self) -> None:
        if self.host.process:
            self.process, self.conn = fork_runner()
        self.thread = threading.Thread(target=self.run, name=f"runner-{self.number}", daemon=True)

    def run(self) -> None:
        host = self.host
        try:
            while True:
                held = host.next_job(self)
                if held is None:
                    return
                started = time.monotonic()
                finish = self._run_process(held) if host.process else self._run_thread(held)
                if self.abandoned or (held.left and host.closing.is_set()):
                    return  # a new runner has taken this one's place, or the host stops
                host.ended(self, held, finish, time.monotonic() - started)
        finally:
            if not host.process:
                connection.close()  # this thread's own

    def _run_thread(self, held: Held) -> Finish | str | None:
        close_old_connections()
        return run_claimed(held.job, held.fence.locked_by, process=False)

    def _run_process(self, held: Held) -> Finish | str | None:
        """Send the job to the child and wait for its end, the child's death or the hard
        time limit; a child that died or was killed is replaced."""
        assert self.conn is not None
        try:
            self.conn.send(job_message(held.job, held.fence.locked_by))
        except OSError:
            self._replace("runner_died", held)
            return None
        while True:
            timeout = max(0.0, held.deadline - time.monotonic())
            ready = wait([self.conn, self.process.sentinel], timeout=timeout)
            if self.conn in ready:
                try:
                    finish: Finish | str | None = self.conn.recv()
                except (EOFError, OSError):
                    break
                return finish
            if ready:  # the sentinel: the child died (killed, out of memory)
                break
            if time.monotonic() >= held.deadline:
                self._replace("job_hard_time_limit", held)
                return None
        self._replace("runner_died", held)
        return None

    def _replace(self, event: str, held: Held) -> None:
        """The child died or ran past the hard limit: its job's lock goes stale and the
        reaper reclaims it, as for any worker lost. A new child takes its place (none
        once the host is closing: it killed the child)."""
        held.left = True
        self.stop(kill=True)
        if self.host.closing.is_set():
            return None
        log.error(
            event,
            job_id=str(held.job.id),
            attempt=held.fence.attempt,
            exitcode=self.process.exitcode,
            left_to_reaper=True,
        )
        self.process, self.conn = fork_runner()
        return None

    def stop(self, *, kill: bool) -> None:
        """End the child: kill it (a job is left to the reaper) or ask it to exit."""
        if self.process is None:
            return
        if kill and self.process.is_alive():
            self.process.kill()
        elif self.process.is_alive() and self.conn is not None:
            try:
                self.conn.send(None)
            except OSError:
                pass
        self.process.join(timeout=5)
        if self.conn is not None:
            self.conn.close()


# --- the host --------------------------------------------------------------------------


class Host:
    """One run_worker process: the claimer, the runners, the completer and the heartbeat
    of the module docstring, and its own thread that supervises them until `stop`."""

    def __init__(
        self, *, queues: list[str], concurrency: int, pool: str, prefetch: int | None = None
    ) -> None:
        self.queues = queues
        self.concurrency = concurrency
        self.process = pool == "processes"
        self.locked_by = worker_identity()
        prefetch = settings.JOBOPS_WORKER_PREFETCH if prefetch is None else prefetch
        self.limit = concurrency * max(1, prefetch)  # jobs in hand (buffered, running)
        self.lock = threading.Lock()
        self.has_work = threading.Condition(self.lock)  # the buffer got jobs
        self.has_room = threading.Condition(self.lock)  # a runner took or ended one
        self.held: dict[uuid.UUID, Held] = {}
        self.buffer: deque[Held] = deque()
        self.in_hand = 0  # buffered or running (not counting ends being written)
        self.run_time: float | None = None  # mean seconds per run, recent runs weigh most
        self.ends: queue.SimpleQueue[tuple[float, Held, Finish] | None] = queue.SimpleQueue()
        self.heartbeats = HeartbeatLoop(autostart=False, log=log)
        self.ready = threading.Event()  # the claimer has connected and looked once
        self.stopping = threading.Event()  # no more claims
        self.closing = threading.Event()  # runners take no more jobs
        self.listener = PendingListener()
        # Children are forked first, while this is the only thread.
        self.slots = [Slot(self, n) for n in range(concurrency)]
        self.claimer = threading.Thread(target=self._claim_loop, name="claimer", daemon=True)
        self.threads = [
            self.claimer,
            threading.Thread(target=self._complete_loop, name="completer", daemon=True),
        ]

    # -- the host's own thread
    def run(self, stop: threading.Event) -> None:
        """Start the stages, supervise them until `stop` and the grace period, stop."""
        # Listening before the first liveness beat: a job created once the host shows
        # up live (a benchmark waits for that) wakes it.
        self.listener._connect()
        # What is loaded by now (Django, the apps, the handlers) lives as long as the
        # process: out of the collector's way, so that a full collection, which stops
        # every thread, stays short on the path from a job's creation to its start.
        gc.freeze()
        for slot in self.slots:
            slot.thread.start()
        for thread in self.threads:
            thread.start()
        self.heartbeats.start()
        # Live once the claimer has its connection and has looked once (the first jobs
        # then pay no connection set-up): `manage.py liveness` and the benchmark see it.
        self.ready.wait(timeout=10)
        log.info(
            "run_worker_started",
            queues=self.queues,
            concurrency=self.concurrency,
            pool="processes" if self.process else "threads",
            prefetch=self.limit // self.concurrency,
            locked_by=self.locked_by,
        )
        next_liveness = 0.0
        while not stop.wait(SUPERVISE_SECONDS if next_liveness else 0):
            now = time.monotonic()
            if now >= next_liveness:
                beat(LIVENESS_KIND, tuple(self.queues))
                next_liveness = now + settings.JOBOPS_PROCESS_HEARTBEAT_SECONDS
            self._enforce_hard_limits()
        self._stop()

    def _stop(self) -> None:
        """SIGTERM: no more claims; the runners finish what the host holds for the grace
        period; what is left then is left to the reaper; the last ends are written."""
        self.stopping.set()
        with self.lock:
            log.info("run_worker_stopping", in_hand=self.in_hand)
            self.has_room.notify_all()
        grace_until = time.monotonic() + settings.JOBOPS_WORKER_GRACE_SECONDS
        # A claim on its way when the stop came still lands in the buffer: count what
        # the host holds once the claimer has ended.
        self.claimer.join(timeout=settings.JOBOPS_WORKER_GRACE_SECONDS)
        while time.monotonic() < grace_until:
            with self.lock:
                if not self.in_hand:
                    break
            self._enforce_hard_limits()
            time.sleep(SUPERVISE_SECONDS)
        self.closing.set()
        self.heartbeats.stop(timeout=0)  # what is left goes stale for the reaper
        with self.lock:
            self.has_work.notify_all()
            left = [h for h in self.held.values() if not h.ending]
            for held in left:
                held.left = True
        for held in left:
            log.warning("job_left_to_reaper", job_id=str(held.job.id), attempt=held.fence.attempt)
        for slot in self.slots:
            slot.stop(kill=slot.held is not None)
        for slot in self.slots:
            if slot.held is None:
                slot.thread.join(timeout=5)
        self.ends.put(None)  # the completer writes what came before it, then ends
        for thread in self.threads:
            thread.join(timeout=10)
        self.heartbeats.stop(timeout=10)
        self.listener.close()
        beat_end(LIVENESS_KIND)
        log.info("run_worker_stopped")

    def _enforce_hard_limits(self) -> None:
        """A thread cannot be stopped: one whose job passed its hard time limit is left
        behind (its job's lock goes stale, the reaper reclaims it, and the thread's late
        writes are refused by their fence); a new runner takes its place. (A process
        runner's own thread kills its child.)"""
        if self.process:
            return
        now = time.monotonic()
        for index, slot in enumerate(self.slots):
            held = slot.held
            if held is None or now < held.deadline or slot.abandoned:
                continue
            log.error(
                "job_hard_time_limit",
                job_id=str(held.job.id),
                attempt=held.fence.attempt,
                left_to_reaper=True,
            )
            with self.lock:
                held.left = slot.abandoned = True
                self.held.pop(held.job.id, None)
                self.heartbeats.remove(held)
                self.in_hand -= 1
                self.has_room.notify_all()
            replacement = Slot(self, slot.number)
            self.slots[index] = replacement
            replacement.thread.start()

    # -- 1. claim
    def _room(self) -> int:
        """How many jobs to claim now (under the lock): up to the limit in hand, with no
        more waiting in the buffer than the runners start within BUFFER_HORIZON_SECONDS
        at the mean run time (none ahead until a run time is known)."""
        ahead = 0
        if self.run_time is not None:
            ahead = math.floor(self.concurrency * BUFFER_HORIZON_SECONDS / max(self.run_time, 1e-6))
        ceiling = min(self.limit, self.concurrency + ahead)
        return max(0, ceiling - self.in_hand)

    def _claim_loop(self) -> None:
        """Claim while there is work and room; sleep on NOTIFY or the poll otherwise."""
        wake, backlog, next_poll = True, False, 0.0
        try:
            while not self.stopping.is_set():
                now = time.monotonic()
                polled = now >= next_poll
                if not (wake or backlog or polled):
                    wake = self.listener.wait(until=next_poll, stop=self.stopping)
                    continue
                with self.lock:
                    room = self._room()
                    # A NOTIFY or the poll takes what room there is at once (a job
                    # waits for nothing); a backlog refills once half the buffer's room
                    # is free: one commit for many jobs.
                    need = 1 if (wake or polled) else max(1, (self.in_hand + room) // 2)
                    if room < need:
                        self.has_room.wait(timeout=SUPERVISE_SECONDS)
                        continue
                wake = False
                claimed = self._claim(room)
                if claimed is None:  # the database is away: try again after the poll
                    backlog, next_poll = False, now + settings.JOBOPS_WORKER_POLL_SECONDS
                    self.stopping.wait(settings.JOBOPS_WORKER_POLL_SECONDS)
                    continue
                backlog = claimed == room
                if polled:
                    next_poll = now + self._poll_in()
                self.ready.set()
        finally:
            connection.close()

    def _claim(self, limit: int) -> int | None:
        """Claim up to `limit` jobs into the buffer; how many, None if the database is away."""
        try:
            jobs = jobs_claim(
                queues=self.queues,
                locked_by=self.locked_by,
                limit=limit,
                skip_types=blocked_types(),
            )
        except DB_DOWN_ERRORS as exc:
            log.error("claim_failed", error=repr(exc))
            connection.close()
            return None
        metrics.WORKER_CLAIMS.inc()
        if jobs:
            with self.lock:
                for job in jobs:
                    held = Held(job, Fence(self.locked_by, job.attempts), host=self)
                    self.held[job.id] = held
                    self.buffer.append(held)
                    self.heartbeats.add(held)
                self.in_hand += len(jobs)
                self.has_work.notify(len(jobs))
        return len(jobs)

    def _poll_in(self) -> float:
        """Until the next look without a NOTIFY: the poll interval, or sooner when a
        retry comes due (retries are due by the clock: no NOTIFY says so)."""
        poll = settings.JOBOPS_WORKER_POLL_SECONDS
        try:
            with connection.cursor() as cursor:
                cursor.execute(QUERIES["next_retry_due"], {"queues": self.queues})
                row = cursor.fetchone()
        except DB_DOWN_ERRORS:
            connection.close()
            return poll
        due = row[0] if row else None
        return poll if due is None else max(0.0, min(poll, float(due)))

    # -- 2. run
    def next_job(self, slot: Slot) -> Held | None:
        """The next buffered job for `slot` (waiting for one); None once the host closes."""
        with self.lock:
            while not self.buffer:
                if self.closing.is_set():
                    return None
                self.has_work.wait(timeout=SUPERVISE_SECONDS)
            if self.closing.is_set():
                return None
            held = self.buffer.popleft()
            spec = get_type(held.job.type)
            held.deadline = time.monotonic() + (spec.time_limit if spec is not None else 0)
            slot.held = held
            return held

    def ended(self, slot: Slot, held: Held, finish: Finish | str | None, seconds: float) -> None:
        """A runner's job ended: its end goes to the completer (or, lost or deferred by
        its connector's breaker, which wrote the deferral itself, is dropped)."""
        with self.lock:
            slot.held = None
            self.in_hand -= 1
            weight = RUN_TIME_WEIGHT if self.run_time is not None else 1.0
            self.run_time = (1 - weight) * (self.run_time or 0.0) + weight * seconds
            self.has_room.notify_all()
            self.heartbeats.remove(held)  # ending or lost: no more beats
            lost = not isinstance(finish, Finish) or held.lost or held.left
            if finish == DEFERRED:
                lost = False
            if lost or not isinstance(finish, Finish):
                self.held.pop(held.job.id, None)
            else:
                # Queued before the lock is released: a stopping host that sees nothing
                # in hand puts the completer's last item after this end, never before.
                held.ending = True
                self.ends.put((time.monotonic(), held, finish))
        if lost and not held.left:  # a job left to the reaper was logged where it was left
            # The attempt's final line; its duration only when the runner decided an end.
            ended = (
                attempt_fields(held.job.type, "lost", finish.seconds)
                if isinstance(finish, Finish)
                else {"outcome": "lost", "error_code": None}
            )
            log.warning(
                "job_lost_stopping", job_id=str(held.job.id), attempt=held.fence.attempt, **ended
            )
            metrics.JOBS_LOST.labels(type=held.job.type).inc()

    # -- 3. complete
    def _complete_loop(self) -> None:
        """Write the ends in windows (jobs.execution.complete.complete_windows) until the
        None of `_stop`."""
        try:
            try:
                connection.ensure_connection()  # before the first window, not during it
            except DB_DOWN_ERRORS:
                connection.close()
            complete_windows(self.ends, self._write)
        finally:
            connection.close()

    def _write(self, window: list[tuple[float, Held, Finish]]) -> None:
        """One window's ends, through the completer both executors share."""
        ends = [
            End(finish, log.bind(job_id=str(finish.job_id), attempt=finish.attempt), h.job.type)
            for _, h, finish in window
        ]
        try:
            write_ends(ends, locked_by=self.locked_by)
        except DB_DOWN_ERRORS as exc:
            # Nothing written: the locks go stale and the reaper reclaims the jobs.
            log.error("completions_failed", jobs=len(window), error=repr(exc))
            connection.close()
        finally:
            with self.lock:
                for _, h, _ in window:
                    self.held.pop(h.job.id, None)

    # -- 4. heartbeat: the core's loop (self.heartbeats), each held job a member
    def _beat(self) -> None:
        """Beat every job the host holds now (the loop does so on its own schedule)."""
        self.heartbeats.beat_now()

    def lost(self, held: Held) -> None:
        """The heartbeat found `held`'s lock gone (reclaimed): its end is not written."""
        with self.lock:
            if held.lost or held.ending:
                return
            held.lost = True
        log.warning("job_lock_lost", job_id=str(held.job.id))


def run_worker(
    *,
    queues: list[str],
    concurrency: int,
    pool: str,
    stop: threading.Event,
    prefetch: int | None = None,
) -> None:
    """Run a Host on `queues` until `stop` (the command's SIGTERM)."""
    Host(queues=queues, concurrency=concurrency, pool=pool, prefetch=prefetch).run(stop)
