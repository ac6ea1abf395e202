"""The postgres executor (docs/postgres-executor.md): `manage.py run_worker`.

A queue configured `JOBOPS_EXECUTOR_<QUEUE>=postgres` never goes through RabbitMQ. One
`Host` per run_worker process runs its jobs:

1. Claim: as many due jobs as it has free runners, in one transaction
   (`jobs.services.jobs_claim`: a SKIP LOCKED select, then one job_append claiming
   them all, each with its `started` entry). Woken by NOTIFY jobs_pending (a job
   created, replayed, resumed) on a connection of its own, and by a free runner while
   the last claim found a backlog; else every JOBOPS_WORKER_POLL_SECONDS, or sooner
   when a retry comes due.
2. Run: each job in a runner, a child process (the default) or a thread
   (JOBOPS_WORKER_POOL=threads, for I/O-bound types), through the same
   `jobs.runtime.run_handler` and `finish_decide` as a Celery worker: the handler
   contract, JobContext, the error taxonomy and backoff are shared. A process runner's
   soft time limit raises SoftTimeLimitExceeded in the handler; past the hard limit the
   host kills it (a thread cannot be killed: it is left behind) and stops beating for
   the job, whose lock goes stale: the reaper reclaims it, as for a worker lost.
3. Complete: the runs' ends are written in windows (up to COMPLETE_BATCH jobs or
   COMPLETE_WINDOW_SECONDS, whichever comes first) by `jobs.services.jobs_finish`:
   one statement per outcome, each job fenced by the host's lock holder and its own
   attempt. A job whose fence failed is reported lost (logged, jobs_lost_total).
4. Heartbeat: one statement for every job the host holds, every
   JOBOPS_HEARTBEAT_SECONDS; a job no longer held (reclaimed) is lost: the host stops
   beating for it and its runner's writes are refused by their fence.
5. SIGTERM: stop claiming, let running jobs finish for JOBOPS_WORKER_GRACE_SECONDS,
   write their ends, then exit; jobs still running then are left to the reaper.
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

import structlog
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import close_old_connections, connection, connections

from core.logging import log_context
from jobs import metrics
from jobs.dispatcher import PendingListener
from jobs.exceptions import JobLost
from jobs.liveness import beat, beat_end
from jobs.models import Job
from jobs.queries import QUERIES
from jobs.runtime import (
    DB_DOWN_ERRORS,
    attempt_fields,
    finish_decide,
    finish_log,
    probe_release,
    run_handler,
    worker_identity,
)
from jobs.services import Fence, Finish, jobs_claim, jobs_finish, jobs_heartbeat
from jobs.services.connectors import blocked_types
from jobs.types import get_type

log = structlog.get_logger("jobs.executor")

# A window of finished runs is written when it holds this many, or this long after its
# first: a drain writes 100 ends per statement, a lone job waits at most 5 ms.
COMPLETE_BATCH = 100
COMPLETE_WINDOW_SECONDS = 0.005
# The liveness kind run_worker hosts beat as (jobs.liveness, `manage.py liveness`).
LIVENESS_KIND = "run_worker"


# --- a runner: one job at a time, in a child process or a thread ----------------------


def _soft_time_limit(_signum: int, _frame: Any) -> None:
    raise SoftTimeLimitExceeded("soft time limit exceeded")


# What a runner sends back for a job its connector's breaker deferred (docs/connectors.md:
# the deferral is written already; the handler did not run).
DEFERRED = "deferred"


def run_claimed(job: Job, locked_by: str, *, process: bool) -> Finish | str | None:
    """Run one claimed job in a runner and decide how it ended; DEFERRED when its
    connector's breaker deferred it; None when it was lost (reclaimed meanwhile) or the
    database could not be reached to decide (the lock then goes stale and the reaper
    reclaims it: nothing is decided without it)."""
    fence = Fence(locked_by, job.attempts)
    bound = log.bind(
        job_id=str(job.id), request_id=job.request_id, correlation_id=job.correlation_id
    )
    spec = get_type(job.type)
    limit = spec.soft_time_limit if spec is not None and process else 0
    with log_context(job_id=str(job.id), org_id=job.org_id, project_id=job.project_id):
        try:
            if limit:
                signal.setitimer(signal.ITIMER_REAL, limit)
            try:
                run = run_handler(job=job, fence=fence, log=bound, heartbeats=None)
            finally:
                if limit:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            try:
                if run.outcome == "deferred":
                    return DEFERRED
                if run.outcome == "lost" or run.ctx._lost.is_set():
                    return None
                return finish_decide(
                    ctx=run.ctx,
                    job=job,
                    spec=run.spec,
                    outcome=run.outcome,
                    error=run.error,
                    result=run.result,
                )
            finally:
                probe_release(run.gate, job_id=job.id, log=bound)
        except JobLost:
            return None
        except DB_DOWN_ERRORS as exc:
            bound.error("database_unavailable_job_left_to_reaper", error=repr(exc))
            connection.close()
            return None


def runner_loop(conn: Connection, *, process: bool) -> None:
    """A runner's life: receive (job, lock holder), run it, send back (job id, Finish or
    None); until it receives None or its host is gone."""
    if process:
        # The host decides when its runners stop (after the grace period): a SIGTERM to
        # the process group must not end a job half-way.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGALRM, _soft_time_limit)
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return
            if message is None:
                return
            job, locked_by = message
            close_old_connections()
            finish = run_claimed(job, locked_by, process=process)
            conn.send((job.id, finish))
    finally:
        connection.close()


@dataclass
class Runner:
    """One slot of the host: a child process or a thread, and the job it runs."""

    process: bool
    conn: Connection = field(init=False)
    worker: Any = field(init=False)
    job: Job | None = None
    fence: Fence | None = None
    deadline: float = 0.0  # the hard time limit (monotonic)
    lost: bool = False  # the heartbeat found the job reclaimed

    def __post_init__(self) -> None:
        self.conn, theirs = multiprocessing.Pipe()
        if self.process:
            # Forked without the host's database connections (each runner opens its own).
            connections.close_all()
            context = multiprocessing.get_context("fork")
            self.worker = context.Process(
                target=runner_loop, args=(theirs,), kwargs={"process": True}, daemon=True
            )
        else:
            self.worker = threading.Thread(
                target=runner_loop, args=(theirs,), kwargs={"process": False}, daemon=True
            )
        self.worker.start()

    @property
    def sentinel(self) -> Any:
        return self.worker.sentinel if self.process else None

    def alive(self) -> bool:
        return bool(self.worker.is_alive())

    def give(self, job: Job, locked_by: str) -> None:
        spec = get_type(job.type)
        self.job, self.fence, self.lost = job, Fence(locked_by, job.attempts), False
        self.deadline = time.monotonic() + (spec.time_limit if spec is not None else 0)
        self.conn.send((job, locked_by))

    def release(self) -> None:
        self.job, self.fence, self.lost = None, None, False

    def stop(self, *, kill: bool) -> None:
        if kill and self.process and self.alive():
            self.worker.kill()
        elif self.alive():
            try:
                self.conn.send(None)
            except OSError:
                pass
        if self.process:
            self.worker.join(timeout=5)
        self.conn.close()


# --- the host --------------------------------------------------------------------------


class Host:
    """One run_worker process: its claimer, runners, completer and heartbeat (the
    module docstring's steps), all driven by one loop that waits on the runners' pipes,
    the LISTEN connection and the clock."""

    def __init__(self, *, queues: list[str], concurrency: int, pool: str) -> None:
        self.queues = queues
        self.process = pool == "processes"
        self.locked_by = worker_identity()
        self.runners = [Runner(self.process) for _ in range(concurrency)]
        self.listener = PendingListener()
        self.done: list[Finish] = []
        self.done_since = 0.0
        self.wake = True  # claim at once: jobs may be waiting already
        self.backlog = False  # the last claim filled every free runner
        self.next_poll = 0.0
        self.next_beat = time.monotonic() + settings.JOBOPS_HEARTBEAT_SECONDS
        self.next_liveness = 0.0

    def run(self, stop: threading.Event) -> None:
        """The loop, until `stop` and the grace period."""
        log.info(
            "run_worker_started",
            queues=self.queues,
            concurrency=len(self.runners),
            pool="processes" if self.process else "threads",
            locked_by=self.locked_by,
        )
        grace_until: float | None = None
        while True:
            now = time.monotonic()
            if stop.is_set() and grace_until is None:
                grace_until = now + settings.JOBOPS_WORKER_GRACE_SECONDS
                log.info("run_worker_stopping", running=len(self._busy()))
            if grace_until is not None and (not self._busy() or now >= grace_until):
                break
            if now >= self.next_liveness:
                beat(LIVENESS_KIND, tuple(self.queues))
                self.next_liveness = now + settings.JOBOPS_PROCESS_HEARTBEAT_SECONDS
            if grace_until is None:
                self._claim(now)
            self._wait(grace_until)
            self._complete(force=grace_until is not None)
            self._beat()
            self._enforce_hard_limits()
        self._complete(force=True)
        for runner in self.runners:
            if runner.job is not None:
                log.warning(
                    "job_left_to_reaper", job_id=str(runner.job.id), attempt=runner.job.attempts
                )
            runner.stop(kill=runner.job is not None)
        self.listener.close()
        beat_end(LIVENESS_KIND)
        log.info("run_worker_stopped")

    # -- 1. claim
    def _idle(self) -> list[Runner]:
        return [r for r in self.runners if r.job is None]

    def _busy(self) -> list[Runner]:
        return [r for r in self.runners if r.job is not None]

    def _claim(self, now: float) -> None:
        idle = self._idle()
        polled = now >= self.next_poll
        if not idle or not (self.wake or polled):
            return
        self.wake = False
        try:
            jobs = jobs_claim(
                queues=self.queues,
                locked_by=self.locked_by,
                limit=len(idle),
                skip_types=blocked_types(),
            )
            if polled:
                self.next_poll = now + self._poll_in()
        except DB_DOWN_ERRORS as exc:
            log.error("claim_failed", error=repr(exc))
            connection.close()
            self.next_poll = now + settings.JOBOPS_WORKER_POLL_SECONDS
            return
        self.backlog = len(jobs) == len(idle)
        for runner, job in zip(idle, jobs, strict=False):
            runner.give(job, self.locked_by)

    def _poll_in(self) -> float:
        """Until the next look without a NOTIFY: the poll interval, or sooner when a
        retry comes due (retries are due by the clock: no NOTIFY says so)."""
        poll = settings.JOBOPS_WORKER_POLL_SECONDS
        with connection.cursor() as cursor:
            cursor.execute(QUERIES["next_retry_due"], {"queues": self.queues})
            row = cursor.fetchone()
        due = row[0] if row else None
        return poll if due is None else max(0.0, min(poll, float(due)))

    # -- waiting for a runner, a notification or the clock
    def _wait(self, grace_until: float | None) -> None:
        now = time.monotonic()
        until = min(self.next_beat, self.next_liveness)
        if grace_until is None:
            until = min(until, self.next_poll)
            if self.wake and self._idle():
                until = now
        else:
            until = min(until, grace_until)
        if self.done:
            until = min(until, self.done_since + COMPLETE_WINDOW_SECONDS)
        busy = self._busy()
        if busy:
            until = min(until, min(r.deadline for r in busy))
        waiting: list[Any] = [r.conn for r in busy]
        waiting += [r.sentinel for r in busy if r.sentinel is not None]
        listening = self.listener._connect() if grace_until is None else None
        if listening is not None:
            waiting.append(listening.fileno())
        ready = wait(waiting, timeout=max(0.0, until - now)) if waiting else []
        if not waiting:
            time.sleep(max(0.0, until - now))
        for runner in busy:
            if runner.conn in ready:
                self._finished(runner)
            elif runner.sentinel is not None and runner.sentinel in ready:
                self._runner_died(runner)
        if listening is not None and listening.fileno() in ready and self.listener.notified():
            self.wake = True

    def _finished(self, runner: Runner) -> None:
        try:
            job_id, finish = runner.conn.recv()
        except (EOFError, OSError):
            self._runner_died(runner)
            return
        job = runner.job
        assert job is not None and job_id == job.id
        if finish == DEFERRED:
            runner.release()
        elif not isinstance(finish, Finish) or runner.lost:
            # The attempt's final line; its duration only when the runner decided an end.
            ended = (
                attempt_fields(job.type, "lost", finish.seconds)
                if isinstance(finish, Finish)
                else {"outcome": "lost", "error_code": None}
            )
            log.warning("job_lost_stopping", job_id=str(job_id), attempt=job.attempts, **ended)
            metrics.JOBS_LOST.labels(type=job.type).inc()
            runner.release()
        else:
            if not self.done:
                self.done_since = time.monotonic()
            self.done.append(finish)
            runner.release()
        # A free runner: claim again at once if the last claim found more than it took.
        if self.backlog:
            self.wake = True

    def _runner_died(self, runner: Runner) -> None:
        """A runner process died (killed, out of memory): its job's lock goes stale and
        the reaper reclaims it, as for any worker lost. A new runner takes its place."""
        job = runner.job
        log.error(
            "runner_died",
            job_id=str(job.id) if job else None,
            attempt=job.attempts if job else None,
            exitcode=getattr(runner.worker, "exitcode", None),
        )
        self._replace(runner)

    def _replace(self, runner: Runner) -> None:
        runner.stop(kill=True)
        self.runners[self.runners.index(runner)] = Runner(self.process)

    # -- 3. complete
    def _complete(self, *, force: bool) -> None:
        if not self.done:
            return
        due = time.monotonic() - self.done_since >= COMPLETE_WINDOW_SECONDS
        if not (force or due or len(self.done) >= COMPLETE_BATCH):
            return
        window, self.done = self.done, []
        try:
            lost = jobs_finish(finishes=window, locked_by=self.locked_by)
        except DB_DOWN_ERRORS as exc:
            # Nothing written: the locks go stale and the reaper reclaims the jobs.
            log.error("completions_failed", jobs=len(window), error=repr(exc))
            connection.close()
            return
        lost_ids = {f.job_id for f in lost}
        for finish in window:
            bound = log.bind(job_id=str(finish.job_id), attempt=finish.attempt)
            if finish.job_id in lost_ids:
                bound.warning(
                    "job_lost_stopping", **attempt_fields(finish.job_type, "lost", finish.seconds)
                )
                job_type = Job.objects.values_list("type", flat=True).filter(id=finish.job_id)
                metrics.JOBS_LOST.labels(type=job_type.first() or "").inc()
            else:
                finish_log(bound, finish)

    # -- 4. heartbeat
    def _beat(self) -> None:
        now = time.monotonic()
        if now < self.next_beat:
            return
        self.next_beat = now + settings.JOBOPS_HEARTBEAT_SECONDS
        held = {
            r.job.id: r.fence
            for r in self._busy()
            if r.job is not None and r.fence is not None and not r.lost
        }
        if not held:
            return
        try:
            alive = jobs_heartbeat(held=held)
        except DB_DOWN_ERRORS as exc:
            log.warning("heartbeat_failed", error=repr(exc))
            connection.close()
            return
        for runner in self._busy():
            assert runner.job is not None
            if runner.job.id in held and runner.job.id not in alive and not runner.lost:
                runner.lost = True
                log.warning("job_lock_lost", job_id=str(runner.job.id))

    # -- the hard time limit
    def _enforce_hard_limits(self) -> None:
        now = time.monotonic()
        for runner in self._busy():
            assert runner.job is not None
            if now < runner.deadline:
                continue
            log.error(
                "job_hard_time_limit",
                job_id=str(runner.job.id),
                attempt=runner.job.attempts,
                left_to_reaper=True,
            )
            if self.process:
                self._replace(runner)
            else:  # a thread cannot be stopped: stop beating for it, take a new one
                runner.lost = True
                self.runners[self.runners.index(runner)] = Runner(self.process)


def run_worker(*, queues: list[str], concurrency: int, pool: str, stop: threading.Event) -> None:
    """Run a Host on `queues` until `stop` (the command's SIGTERM)."""
    Host(queues=queues, concurrency=concurrency, pool=pool).run(stop)
