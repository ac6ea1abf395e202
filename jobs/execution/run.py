"""Running one claimed job: the connector gate, the handler with its `JobContext`, the
decision, the hand-over of its end to a writer (docs/architecture.md#outcomes-of-a-run).

The shell both executors run (`run_claimed`); what differs between them stays in their
adapters: how a job is claimed (a Celery message's compare-and-set, a run_worker host's
batch), which heartbeat loop keeps its lock, how the soft time limit is raised
(`jobs.execution.limits.SoftLimit`), and how its end reaches the completer (at once, as
a batch of one, or through a host's window: `write_end`). Every way a run can end comes
back as an `Ended` for the adapter to answer its delivery with.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

from django.db import InterfaceError, OperationalError

from jobs.domain.errors import JobCancelled
from jobs.domain.exceptions import JobLost
from jobs.domain.types import JobType, get_type
from jobs.execution.context import JobContext
from jobs.execution.decide import finish_decide
from jobs.execution.heartbeat import HeartbeatLoop
from jobs.execution.limits import SoftLimit
from jobs.integrations import metrics
from jobs.models import Job
from jobs.services import Fence, Finish, validate_result
from jobs.services.connectors import Gate, connector_gate, connector_probe_release

# The database could not be reached: nothing may be decided without it.
DB_DOWN_ERRORS = (OperationalError, InterfaceError)


class Run(NamedTuple):
    """A claimed job's run (`run_handler`): its context and type, the connector gate's
    decision, and the outcome: `succeeded` with its result, `cancelled`, `lost`,
    `deferred` (the handler did not start: its connector's breaker is open) or `error`
    with the exception."""

    ctx: JobContext
    spec: JobType
    gate: Gate
    outcome: str
    error: BaseException | None = None
    result: dict[str, Any] | None = None


def run_handler(*, job: Job, fence: Fence, log: Any, heartbeats: HeartbeatLoop | None) -> Run:
    """Run a claimed job's handler with its `JobContext`, as both executors do, unless
    its connector's breaker defers it (docs/connectors.md: the job waits `retrying` for
    the probe, its attempt given back). `heartbeats` keeps the lock alive meanwhile (a
    Celery worker's; run_worker's host beats for all its jobs itself). The database
    unreachable at the gate raises (DB_DOWN_ERRORS): the caller decides nothing."""
    log = log.bind(
        attempt=job.attempts, idempotency_key=str(job.id), queue=job.queue, job_type=job.type
    )
    ctx = JobContext(job=job, fence=fence, log=log)
    spec = get_type(job.type)
    assert spec is not None
    try:
        gate = connector_gate(job=job, fence=fence)
    except JobLost:
        return Run(ctx, spec, Gate(connector=None), "lost")
    if gate.deferred is not None:
        connector = gate.connector.name if gate.connector else None
        log.info("job_deferred", connector=connector, delay=round(gate.delay, 3))
        return Run(ctx, spec, gate, "deferred")
    ctx.provider = gate.connector
    if gate.connector is not None and gate.connector.provider is not None:
        log = ctx.log = log.bind(provider=gate.connector.provider)
    log.info("job_started")
    if spec.time_limit:
        ctx.deadline = ctx.started + spec.time_limit  # enforced where a loop does so
    if heartbeats is not None:
        heartbeats.add(ctx)
    outcome, error, result = "succeeded", None, None
    in_progress = metrics.JOB_IN_PROGRESS.labels(type=job.type)
    in_progress.inc()
    try:
        try:
            ctx.check_cancel()
            result = spec.load_handler()(ctx, job.params)
            if result is not None and not isinstance(result, dict):
                result = {"value": result}
            validate_result(result)
        except JobCancelled:
            outcome = "cancelled"
        except JobLost:
            outcome = "lost"
        except Exception as exc:
            outcome, error = "error", exc
    finally:
        if heartbeats is not None:
            heartbeats.remove(ctx)
        in_progress.dec()
    return Run(ctx, spec, gate, outcome, error, result)


def probe_release(gate: Gate, *, job_id: uuid.UUID, log: Any) -> None:
    """After the run of its connector's half-open breaker's probe, whatever its end: a
    probe that told nothing (a cancel, a bug, a lost lock) lets the next due job probe."""
    if not gate.probe:
        return
    try:
        connector_probe_release(gate=gate, job_id=job_id)
    except Exception as exc:  # the database away: the probe's lease runs out instead
        log.warning("connector_probe_release_failed", error=repr(exc))


# How a run ended, for its adapter (`Ended.outcome`).
ENDED = "ended"  # decided, and its end handed to `write_end` (`Ended.written`: its answer)
DEFERRED = "deferred"  # its connector's breaker deferred it (written already)
LOST = "lost"  # its lock was found gone while the handler ran
LOST_DECIDING = "lost_deciding"  # its lock was found gone while its end was decided
DB_DOWN = "db_down"  # the database unreachable (`Ended.error`): nothing decided


class Ended(NamedTuple):
    """What `run_claimed` came to: its `outcome` (above), the run (None when the database
    was away before it began), the decided finish and what `write_end` answered."""

    outcome: str
    run: Run | None
    finish: Finish | None = None
    written: Any = None
    error: BaseException | None = None


def run_claimed(
    *,
    job: Job,
    fence: Fence,
    log: Any,
    soft_limit: SoftLimit,
    heartbeats: HeartbeatLoop | None,
    write_end: Callable[[Finish, Run], Any],
) -> Ended:
    """Run one claimed job, decide how it ended and hand its end to `write_end` (the
    completer, at once or through a window); then release its connector's probe unless
    its end tells the breaker something (a success, a connector failure: the completer
    counts it, and closes the breaker or opens it again). `soft_limit`: the adapter's
    (the exception class the handler sees, and whether a timer raises it here). JobLost
    and the database unreachable are answered, never raised: see `Ended`."""
    spec = get_type(job.type)
    try:
        with soft_limit.armed(spec.soft_time_limit if spec is not None else 0):
            run = run_handler(job=job, fence=fence, log=log, heartbeats=heartbeats)
    except JobLost:
        return Ended(LOST, None)
    except DB_DOWN_ERRORS as exc:
        return Ended(DB_DOWN, None, error=exc)
    finish: Finish | None = None
    try:
        if run.outcome == "deferred":
            return Ended(DEFERRED, run)
        if run.outcome == "lost" or run.ctx._lost.is_set():
            return Ended(LOST, run)
        finish = finish_decide(
            ctx=run.ctx,
            job=job,
            spec=run.spec,
            outcome=run.outcome,
            error=run.error,
            result=run.result,
            time_limit_error=soft_limit.error,
        )
        return Ended(ENDED, run, finish, write_end(finish, run))
    except JobLost:
        return Ended(LOST_DECIDING, run)
    except DB_DOWN_ERRORS as exc:
        return Ended(DB_DOWN, run, error=exc)
    finally:
        if finish is None or finish.connector is None:
            probe_release(run.gate, job_id=job.id, log=run.ctx.log)
