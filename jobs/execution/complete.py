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

import queue
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import structlog

from jobs.domain.states import Status
from jobs.execution.batches import Answer, BatchThread, Pending, answer_all, fail_all, windows
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
    time) to `write` in windows (jobs.execution.batches.windows): `batch` of them, or
    what came within COMPLETE_WINDOW_SECONDS of the window's first; until a None, after
    what came before it is written."""
    windows(ends, write, batch=batch, seconds=COMPLETE_WINDOW_SECONDS)


class Completer(BatchThread[tuple[End, str], Finish]):
    """A process's completer thread for callers that wait for their own end: a Celery
    worker under the threads pool, whose task must not return (and its message be
    acked) before its end is committed. Each `write` joins a window (at most `batch`
    ends: the pool's size, since no more callers can be waiting, or what came within
    COMPLETE_WINDOW_SECONDS of the window's first) and returns once the window's
    transaction has committed, with its end as written (`write_ends`), or raises what
    the window's write raised (the database unreachable: nothing of the window is
    written, each caller answers its delivery as for an end it could not write). Ends
    of several lock holders in one window are written per holder. The thread
    (jobs.execution.batches.BatchThread) starts on first use in a process."""

    name = "completer"

    def __init__(self, *, batch: int = COMPLETE_BATCH) -> None:
        super().__init__(batch=min(batch, COMPLETE_BATCH))

    def window_seconds(self) -> float:
        return COMPLETE_WINDOW_SECONDS

    def write(self, end: End, *, locked_by: str) -> Finish | None:
        """Write `end` in the next window; its finish as written, or None (lost)."""
        return self.call((end, locked_by))

    def _serve(self, window: list[Pending[tuple[End, str], Finish]]) -> None:
        holders: dict[str, list[tuple[End, Answer[Finish]]]] = {}
        for _, (end, locked_by), answer in window:
            holders.setdefault(locked_by, []).append((end, answer))
        for locked_by, items in holders.items():
            answers = [answer for _, answer in items]
            try:
                finishes = write_ends([end for end, _ in items], locked_by=locked_by)
            except Exception as exc:
                # Every caller of the window hears it: nothing of theirs was written.
                _log.error("completions_failed", jobs=len(items), error=repr(exc))
                fail_all(answers, exc)
                continue
            answer_all(answers, finishes)


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
    job_duration_seconds{type,status=outcome} and jobs_duration_seconds{job_type,queue}."""
    metrics.JOB_DURATION.labels(type=job_type, status=outcome).observe(seconds)
    metrics.JOBS_DURATION.labels(**metrics.jobs_labels(job_type)).observe(seconds)
    return {"outcome": outcome, "error_code": error_code, "duration_ms": round(seconds * 1000)}
