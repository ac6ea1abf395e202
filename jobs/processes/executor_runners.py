"""run_worker's runners (docs/postgres-executor.md, step 2 of jobs.processes.executor): one
job's run through the execution core (`run_claimed`, the postgres executor's adapter of
jobs.execution.run) in a runner thread or a child process, and the child processes'
life: fed jobs down a pipe, ending with their host however it ends (`_watch_host`)."""

from __future__ import annotations

import functools
import gc
import multiprocessing
import os
import select
import signal
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import structlog
from celery.exceptions import SoftTimeLimitExceeded
from django.db import close_old_connections, connection, connections

from core.logging import log_context
from jobs.execution import run as core
from jobs.execution.limits import SoftLimit
from jobs.models import Job
from jobs.services import Fence, Finish

log = structlog.get_logger("jobs.executor")


# --- running one job, in a child process or a runner thread ----------------------------


# Handlers catch the same class under both executors (jobs.execution.limits): a child
# process raises it by its own timer; a runner thread cannot be interrupted (its job's
# hard limit leaves it behind instead).
SOFT_LIMIT_PROCESS = SoftLimit(SoftTimeLimitExceeded, timer=True)
SOFT_LIMIT_THREAD = SoftLimit(SoftTimeLimitExceeded)

# What a runner reports for a job its connector's breaker deferred (docs/connectors.md:
# the deferral is written already; the handler did not run).
DEFERRED = core.DEFERRED


def run_claimed(job: Job, locked_by: str, *, process: bool) -> Finish | str | None:
    """Run one claimed job and decide how it ended (the core's `run_claimed`; its end is
    the host's completer's to write); DEFERRED when its connector's breaker deferred it;
    None when it was lost (reclaimed meanwhile) or the database could not be reached to
    decide (the lock then goes stale and the reaper reclaims it: nothing is decided
    without it)."""
    bound = log.bind(
        job_id=str(job.id), request_id=job.request_id, correlation_id=job.correlation_id
    )
    with log_context(job_id=str(job.id), org_id=job.org_id, project_id=job.project_id):
        ended = core.run_claimed(
            job=job,
            fence=Fence(locked_by, job.attempts),
            log=bound,
            soft_limit=SOFT_LIMIT_PROCESS if process else SOFT_LIMIT_THREAD,
            heartbeats=None,  # the host beats for every job it holds
            write_end=lambda finish, _run: finish,
        )
        if ended.outcome == core.DB_DOWN:
            bound.error("database_unavailable_job_left_to_reaper", error=repr(ended.error))
            connection.close()
    if ended.outcome == core.DEFERRED:
        return DEFERRED
    return ended.finish if ended.outcome == core.ENDED else None


@functools.cache
def _job_columns() -> tuple[str, ...]:
    return tuple(f.attname for f in Job._meta.concrete_fields)


def job_message(job: Job, locked_by: str) -> tuple[tuple[Any, ...], str]:
    """What goes down a child's pipe for a job: its column values and the lock holder.
    A model instance pickles at about twice the cost (its state, its field cache)."""
    return tuple(getattr(job, name) for name in _job_columns()), locked_by


# A child looks whether its host is alive at least this often, and once its host is
# gone gives its handler this long to unwind before it exits regardless (a handler stuck
# in C code does not see the exception).
HOST_WATCH_SECONDS = 0.25
HOST_GONE_GRACE_SECONDS = 1.0


class HostGone(BaseException):
    """Raised in a child's main thread once its host is gone. A BaseException: a
    handler's `except Exception` does not take it for one of its own errors."""


def _host_gone(_signum: int, _frame: Any) -> None:
    raise HostGone("run_worker host gone")


# A pipe nobody writes to, made by the host before its first fork: each child closes its
# copy of the write end at once, so the read end reaches EOF when the host's copy closes,
# that is when the host dies, however it dies (docs/postgres-executor.md).
_HOST_PIPE: tuple[int, int, int] | None = None  # (the host's pid, read end, write end)


def _host_pipe() -> tuple[int, int]:
    global _HOST_PIPE
    if _HOST_PIPE is None or _HOST_PIPE[0] != os.getpid():
        _HOST_PIPE = (os.getpid(), *os.pipe())
    return _HOST_PIPE[1], _HOST_PIPE[2]


def _watch_host(host: int, alive: int) -> None:
    """A child's watcher thread: once its host is gone (the pipe at EOF, or the child
    adopted by another parent), interrupt the handler (`HostGone` in the main thread,
    so that its `finally` blocks run) and exit after HOST_GONE_GRACE_SECONDS at the
    latest. The job's end could never be written: the host writes ends, not the child.
    What the handler still writes meanwhile (progress, artefacts) is fenced by the
    host's lock holder and the attempt, refused once the reaper has reclaimed the job.

    Not PR_SET_PDEATHSIG: it fires when the forking *thread* ends, and a child is
    forked by a runner thread that a replacement may take the place of. The pipe alone
    is not enough either: a child forked meanwhile holds the write end until it closes
    its copy, hence the parent's pid as well."""
    while True:
        readable, _, _ = select.select([alive], [], [], HOST_WATCH_SECONDS)
        if readable or os.getppid() != host:
            break
    log.warning("runner_host_gone", host_pid=host, grace_seconds=HOST_GONE_GRACE_SECONDS)
    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)
    time.sleep(HOST_GONE_GRACE_SECONDS)
    os._exit(1)


def runner_process(conn: Connection, host: int, alive: tuple[int, int]) -> None:
    """A child process's life: receive a job (`job_message`), run it, send back its
    Finish (or None); until it receives None or its host is gone (`_watch_host`)."""
    # The host decides when its runners stop (after the grace period): a SIGTERM to the
    # process group must not end a job half-way.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    SOFT_LIMIT_PROCESS.install()
    signal.signal(signal.SIGUSR1, _host_gone)
    os.close(alive[1])
    threading.Thread(
        target=_watch_host, args=(host, alive[0]), name="host-watch", daemon=True
    ).start()
    gc.freeze()  # as the host does (Host.run): short full collections
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return
            if message is None:
                return
            values, locked_by = message
            job = Job.from_db(None, _job_columns(), values)
            close_old_connections()
            finish = run_claimed(job, locked_by, process=True)
            try:
                conn.send(finish)
            except OSError:  # the host is gone: nobody would write this end
                return
    except HostGone:
        return
    finally:
        connection.close()


def fork_runner() -> tuple[Any, Connection]:
    """A child process running `runner_process`, and the host's end of its pipe. Forked
    without the forking thread's database connection (each child opens its own); the
    other threads' connections are theirs alone and the child never touches them."""
    ours, theirs = multiprocessing.Pipe()
    connections.close_all()
    process = multiprocessing.get_context("fork").Process(
        target=runner_process, args=(theirs, os.getpid(), _host_pipe()), daemon=True
    )
    process.start()
    theirs.close()
    return process, ours
