"""The heartbeat: one loop that keeps the locks of the jobs a process runs alive, the
same for a Celery worker process (its running jobs' `JobContext`s) and a run_worker host
(every job it holds, buffered ones included): docs/architecture.md#claim-heartbeat-reaper.

Every JOBOPS_HEARTBEAT_SECONDS after its claim, each member's lock is refreshed (fenced,
`jobs_heartbeat`) and its cancel flag read; the member hears the answer (`beat_held`:
a `JobContext` flushes a coalesced progress value its handler left waiting) or that its
lock is gone (`beat_lost`). Members due within half a heartbeat of each other are
refreshed by one statement: a host with hundreds of jobs writes about one a heartbeat.

One long-lived thread (started on first use, after a pool forked, or by its owner) with
its own database connection, rather than a thread per job: a short job then costs no
thread start and join, and a beat no new connection. The thread never sleeps longer
than one heartbeat, so a member added now (first beat one heartbeat from now) is always
due after the thread's next wake-up: `add` need not wake it. A wake-up per job was a
thread switch and a fight for the GIL with the job itself, for nothing, on every short
job.

A loop with `hard_limits` (a Celery worker under the threads pool, which enforces no time
limit itself) also ends the hold of a member past its `deadline` (its type's hard time
limit): a thread cannot be stopped, so its job is abandoned as run_worker's thread
runners abandon theirs. The loop stops beating for it, so its lock goes stale and the
reaper reclaims it; the member hears `hard_limit_passed` (a `JobContext` then refuses its
handler's further calls, and what the run writes later is refused by its fence). `add`
wakes the thread only for a hard limit due before its next wake-up.
"""

from __future__ import annotations

import math
import os
import threading
import time
import uuid
from typing import Any, Protocol, cast

import structlog
from django.conf import settings
from django.db import connection

from jobs.domain.exceptions import JobLost
from jobs.services import Fence, jobs_heartbeat

logger = structlog.get_logger("jobs.execution")


class Beating(Protocol):
    """A job whose lock a heartbeat loop keeps alive."""

    @property
    def job_id(self) -> uuid.UUID: ...

    @property
    def fence(self) -> Fence: ...

    @property
    def log(self) -> Any: ...

    def beat_held(self, cancel_requested: bool) -> None:
        """The lock was refreshed; `cancel_requested`: the row's flag. May raise JobLost."""

    def beat_lost(self) -> None:
        """The lock is gone (the job was reclaimed): called once, after its removal."""


class Limited(Beating, Protocol):
    """A member with a hard time limit (for a loop with `hard_limits`)."""

    @property
    def deadline(self) -> float | None:
        """Its hard time limit (monotonic), or None: none."""

    def hard_limit_passed(self) -> None:
        """It ran past `deadline` and is no longer a member: abandoned to the reaper."""


class HeartbeatLoop:
    """The heartbeat thread of one process (see the module docstring). `autostart`: the
    first `add` in a process starts the thread (a Celery pool child: a thread does not
    survive a fork); otherwise its owner calls `start` and `stop`."""

    def __init__(
        self, *, autostart: bool = True, log: Any = None, hard_limits: bool = False
    ) -> None:
        self._members: dict[Any, tuple[Beating, float]] = {}  # job id -> (member, next beat)
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._stopped = False
        self._autostart = autostart
        self._hard_limits = hard_limits
        self._wake_at = math.inf  # when the thread wakes next (monotonic)
        self.log = log if log is not None else logger

    def start(self) -> None:
        with self._changed:
            self._start()

    def _start(self) -> None:
        if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
            self._pid = os.getpid()  # a thread does not survive a fork: start anew
            self._stopped = False
            self._thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """End the thread (after a beat under way) and wait for it up to `timeout`."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=timeout)

    def add(self, member: Beating) -> None:
        with self._changed:
            if self._autostart:
                self._start()
            due = time.monotonic() + settings.JOBOPS_HEARTBEAT_SECONDS
            self._members[member.job_id] = (member, due)
            # A beat is never due before the thread's next wake-up; a hard limit may be
            # (a type's limit can be shorter than a heartbeat).
            deadline = self._deadline(member)
            if deadline is not None and deadline < self._wake_at:
                self._changed.notify_all()

    def remove(self, member: Beating) -> None:
        """No beat for this job any more. A beat already under way is fenced: once the
        job has left `running` it matches no row, and a job no longer a member is not
        told it was lost."""
        with self._changed:
            known = self._members.get(member.job_id)
            if known is not None and known[0] is member:
                del self._members[member.job_id]

    def beat_now(self) -> None:
        """Beat every member at once, in the calling thread (a test's, a host's check)."""
        with self._changed:
            members = [member for member, _ in self._members.values()]
        self._beat(members)

    def _run(self) -> None:
        try:
            while True:
                with self._changed:
                    if self._stopped:
                        return
                    now = time.monotonic()
                    overdue = self._overdue(now)
                    interval = settings.JOBOPS_HEARTBEAT_SECONDS
                    wakes = (
                        (self._wakes(member, at) for member, at in self._members.values())
                        if self._hard_limits
                        else (at for _, at in self._members.values())
                    )
                    soonest = min(wakes, default=now + interval)
                    if not overdue and soonest > now:
                        self._wake_at = min(soonest, now + interval)
                        self._changed.wait(timeout=max(0.0, self._wake_at - now))
                        self._wake_at = math.inf
                        continue
                    # Due now, and those due within half a heartbeat: one statement.
                    horizon = now + interval / 2
                    due = [member for member, at in self._members.values() if at <= horizon]
                    for member in due:
                        self._members[member.job_id] = (member, now + interval)
                for member in overdue:
                    member.hard_limit_passed()
                self._beat(due)
        finally:
            connection.close()  # this thread's own

    def _deadline(self, member: Beating) -> float | None:
        """`member`'s hard limit (monotonic) when this loop enforces them and it has one."""
        return getattr(member, "deadline", None) if self._hard_limits else None

    def _wakes(self, member: Beating, beat_at: float) -> float:
        """When the thread must wake for `member`: its next beat, or its hard limit."""
        deadline = self._deadline(member)
        return beat_at if deadline is None else min(beat_at, deadline)

    def _overdue(self, now: float) -> list[Limited]:
        """The members past their hard limit (under the lock), no longer members."""
        overdue: list[Limited] = []
        if not self._hard_limits:
            return overdue
        for member, _ in list(self._members.values()):
            deadline = self._deadline(member)
            if deadline is not None and deadline <= now:
                del self._members[member.job_id]
                overdue.append(cast(Limited, member))
        return overdue

    def _beat(self, members: list[Beating]) -> None:
        if not members:
            return
        try:
            alive = jobs_heartbeat(held={m.job_id: m.fence for m in members})
        except Exception as exc:
            # A database blip: the next beat tries again (the lock may go stale, then the
            # reaper reclaims the job and our writes are refused).
            log = members[0].log if len(members) == 1 else self.log.bind(jobs=len(members))
            log.warning("heartbeat_failed", error=repr(exc))
            connection.close()  # this thread's own
            return
        for member in members:
            if member.job_id not in alive:
                self._lost(member)
                continue
            try:
                member.beat_held(alive[member.job_id])
            except JobLost:
                self._lost(member)
            except Exception as exc:  # its progress write met a blip: the next beat retries
                member.log.warning("heartbeat_failed", error=repr(exc))
                connection.close()

    def _lost(self, member: Beating) -> None:
        with self._changed:
            known = self._members.get(member.job_id)
            running = known is not None and known[0] is member
            if running:
                del self._members[member.job_id]
        if running:  # not a job that just ended while its beat was on the way
            member.beat_lost()
