"""The completer: the one writer of every run's end, under both executors
(docs/architecture.md#outcomes-of-a-run, docs/postgres-executor.md).

`write_ends` writes the decided ends (`Finish`) of one lock holder through
`jobs.services.jobs_complete`, in one transaction: the batch's ends of connectors
counted by their breakers (each changed breaker row written once), what depends on the
breaker resolved from that count (a connector failure held for the probe instead of its
backoff or its dead letter), then one statement per outcome for the batch, each job
fenced by the holder and its own attempt. A Celery prefork child writes its one end as
a batch of one; a run_worker host writes windows of them (`complete_windows`:
COMPLETE_BATCH ends, or what came within COMPLETE_WINDOW_SECONDS of the window's
first), and so does a Celery threads-pool worker, through a `Completer` whose callers
each wait for their own end's answer (their delivery is acked only after it). Each end's
attempt line is logged here once it is written, as it was written (`finish_log`); an end
whose fence failed is lost (its job was reclaimed: logged `job_lost_stopping`,
jobs_lost_total) and the others are unaffected.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import structlog
from django.db import connection

from jobs.domain.states import Status
from jobs.integrations import metrics
from jobs.services import Finish, jobs_complete

# A window of finished runs is written when it holds this many, or this long after its
# first: a drain writes up to 100 ends per statement and commit, a lone job waits at
# most 5 ms.
COMPLETE_BATCH = 100
COMPLETE_WINDOW_SECONDS = 0.005

_log = structlog.get_logger("jobs.execution")


class End(NamedTuple):
    """A decided end on its way to the completer: the finish, the log its attempt's line
    goes to (bound to the job) and the job's type (jobs_lost_total's label)."""

    finish: Finish
    log: Any
    job_type: str


def write_ends(ends: Sequence[End], *, locked_by: str) -> list[Finish | None]:
    """Write `ends` (of jobs held by `locked_by`) and log each attempt's final line;
    returns, for each end, its finish as written (its breaker's part resolved: a
    connector failure its breaker holds is `retrying`), or None when its job was found
    lost. The database unreachable raises (nothing is written: the locks go stale and
    the reaper reclaims the jobs)."""
    completion = jobs_complete(finishes=[end.finish for end in ends], locked_by=locked_by)
    written = {(str(f.job_id), f.attempt): f for f in completion.written}
    answers: list[Finish | None] = []
    for finish, log, job_type in ends:
        done = written.get((str(finish.job_id), finish.attempt))
        if done is None:
            seconds = finish.seconds
            log.warning("job_lost_stopping", **attempt_fields(finish.job_type, "lost", seconds))
            metrics.JOBS_LOST.labels(type=job_type).inc()
        else:
            finish_log(log, done)
        answers.append(done)
    return answers


def complete_windows(
    ends: queue.SimpleQueue[Any], write: Callable[[list[Any]], None], *, batch: int = COMPLETE_BATCH
) -> None:
    """Hand the items of `ends` (each a tuple whose first value is its monotonic arrival
    time) to `write` in windows: `batch` of them, or what came within
    COMPLETE_WINDOW_SECONDS of the window's first; until a None, after what came before
    it is written."""
    closed = False
    while not closed:
        item = ends.get()
        if item is None:
            return
        window = [item]
        due = item[0] + COMPLETE_WINDOW_SECONDS
        while len(window) < batch:
            try:
                more = ends.get(timeout=max(0.0, due - time.monotonic()))
            except queue.Empty:
                break
            if more is None:
                closed = True
                break
            window.append(more)
        write(window)


class _Answer:
    """What one caller of `Completer.write` waits for: its end as written, or the error
    that kept its window from being written."""

    __slots__ = ("done", "error", "finish")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.finish: Finish | None = None
        self.error: BaseException | None = None


class Completer:
    """A process's completer thread for callers that wait for their own end: a Celery
    worker under the threads pool, whose task must not return (and its message be
    acked) before its end is committed. Each `write` joins a window
    (`complete_windows`, at most `batch` ends: the pool's size, since no more callers
    can be waiting) and returns once the window's transaction has committed, with its
    end as written (`write_ends`), or raises what the window's write raised (the
    database unreachable: nothing of the window is written, each caller answers its
    delivery as for an end it could not write). Ends of several lock holders in one
    window are written per holder. The thread starts on first use in a process."""

    def __init__(self, *, batch: int = COMPLETE_BATCH) -> None:
        self.batch = max(1, min(batch, COMPLETE_BATCH))
        self._ends: queue.SimpleQueue[tuple[float, End, str, _Answer] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def write(self, end: End, *, locked_by: str) -> Finish | None:
        """Write `end` in the next window; its finish as written, or None (lost)."""
        self._start()
        answer = _Answer()
        self._ends.put((time.monotonic(), end, locked_by, answer))
        while not answer.done.wait(timeout=1.0):
            thread = self._thread
            if thread is None or not thread.is_alive():  # never answered: nothing written
                raise RuntimeError("the completer thread ended before writing this end")
        if answer.error is not None:
            raise answer.error
        return answer.finish

    def stop(self, timeout: float | None = None) -> None:
        """End the thread once the ends before this call are written (a test's end)."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            self._ends.put(None)
            thread.join(timeout=timeout)

    def _start(self) -> None:
        if self._thread is not None and self._pid == os.getpid() and self._thread.is_alive():
            return
        with self._lock:
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="completer", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        try:
            complete_windows(self._ends, self._write, batch=self.batch)
        finally:
            connection.close()  # this thread's own

    def _write(self, window: list[tuple[float, End, str, _Answer]]) -> None:
        holders: dict[str, list[tuple[End, _Answer]]] = {}
        for _, end, locked_by, answer in window:
            holders.setdefault(locked_by, []).append((end, answer))
        for locked_by, items in holders.items():
            try:
                finishes = write_ends([end for end, _ in items], locked_by=locked_by)
            except Exception as exc:
                # Every caller of the window hears it: nothing of theirs was written.
                _log.error("completions_failed", jobs=len(items), error=repr(exc))
                connection.close()
                for _, answer in items:
                    answer.error = exc
                    answer.done.set()
                continue
            for (_, answer), finish in zip(items, finishes, strict=True):
                answer.finish = finish
                answer.done.set()


def finish_log(log: Any, finish: Finish) -> None:
    """The attempt's final log line once its end is written (the same for both
    executors): besides its bound `attempt`, its outcome, error code and duration
    (attempt_fields, which also observes job_duration_seconds)."""
    attempt = attempt_fields(finish.job_type, str(finish.target), finish.seconds, finish.error_code)
    if finish.target == Status.SUCCEEDED:
        log.info("job_succeeded", **attempt)
    elif finish.target == Status.CANCELLED:
        log.info("job_cancelled", **attempt)
    elif finish.target == Status.RETRYING:
        log.warning(
            "job_retrying", delay=round(finish.delay or 0, 3), error=finish.error_message, **attempt
        )
    else:
        log.error("job_dead_lettered", reason=finish.reason, error=finish.error_message, **attempt)


def attempt_fields(
    job_type: str, outcome: str, seconds: float, error_code: str | None = None
) -> dict[str, Any]:
    """What an attempt's final log line says of how it ended: `outcome` (succeeded,
    retrying, failed, cancelled, lost), `error_code` (None without an error) and
    `duration_ms` (from its claim); observes the run time in
    job_duration_seconds{type,status=outcome}."""
    metrics.JOB_DURATION.labels(type=job_type, status=outcome).observe(seconds)
    return {"outcome": outcome, "error_code": error_code, "duration_ms": round(seconds * 1000)}
