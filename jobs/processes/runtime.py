"""The Celery adapter of the execution core (jobs.execution): one delivery of a job's message.

`job_execute` is what every Celery task `jobs.<type>` calls (docs/architecture.md). What
is the message's (its payload, its claim, rejecting it or handing it back) is here; the
run, the decision, the end's write and the heartbeat are the core's, shared with
run_worker (jobs.processes.executor):

1. Decode the wire payload; a message that names no job is rejected without requeue
   (the broker dead-letters it and the watcher records it with a null job). A payload
   version this worker does not read (`jobs.integrations.wire`) fails a claimable job with an
   `UNSUPPORTED_VERSION` dead letter before any claim, and the message is rejected
   without requeue: the handler never meets a payload it was not written for.
2. Claim (one compare-and-set), only a job of the message's organisation
   (`org_id`, when the message has one: docs/tenancy.md#execution) whose organisation
   is not suspended, in a queue that is not paused. Zero rows: read why. A message
   whose `org_id` is not the row's fails the job non-retryably (`TENANT_MISMATCH`, a
   dead letter) and is rejected without requeue; a queued job of a suspended
   organisation or a paused queue is held (back to `pending`, no attempt spent:
   jobs.services.holds) and the message acked; anything else (a duplicate, a stale
   message, the job runs elsewhere) is acked, nothing done.
3. While the job's connector's breaker is open, do not start it: defer it (`retrying`
   until the probe time plus jitter, audited `deferred`, its attempt given back:
   jobs.services.connectors). Else run the handler with a `JobContext` while the
   process's heartbeat thread refreshes the lock.
4. Record the outcome, fenced by `Fence(locked_by, attempt)`: succeeded; retrying
   with a jittered backoff, or the connector's Retry-After when longer, or until its
   breaker's probe once a connector failure opened it (the dispatcher republishes it
   when due; the soft time limit only JOBOPS_TIME_LIMIT_RETRIES times per job);
   failed with a dead letter, committed BEFORE the message is rejected with
   requeue=False so that the broker DLQ gets its copy; cancelled. `JobLost` anywhere:
   stop, ack, write nothing more. The database unreachable: reject with requeue=True
   and decide nothing.

Under Celery's threads pool (`--pool threads`: the Procfile's light worker group,
`configure_pool` at worker init) the tasks of one process share what a run_worker host's
runners share: one lock holder for the process; one claimer thread (the core's
`Claimer`) that claims the jobs of the deliveries starting together, one statement per
organisation (a message without `org_id` claims alone, as before); one completer thread
(the core's `Completer`) that writes the ends of the tasks that finish together in one
transaction, each task waiting for its own end to commit before it returns (so its
message is acked only after); and a heartbeat loop that enforces the types' hard time
limits, which the threads pool does not (docs/architecture.md#claim-heartbeat-reaper:
time limits). Only deliveries a thread is starting are claimed, never the messages
Celery holds prefetched (jobs.execution.claim says why). Under prefork each child claims
its one job and writes its one end at once, a batch of one.
"""

from __future__ import annotations

import time
import uuid
from functools import partial
from typing import Any

import structlog
from celery.exceptions import Reject, SoftTimeLimitExceeded
from django.conf import settings
from django.db import connection

from core.logging import log_context
from jobs.domain.errors import TenantMismatchError, UnsupportedVersionError
from jobs.domain.exceptions import TransitionRefusedError
from jobs.domain.states import Status

# The core's names this adapter runs a job with (jobs.runtime re-exports JobContext
# for handler authors).
from jobs.execution import decide as _decide
from jobs.execution.claim import Claimer
from jobs.execution.complete import Completer, End, attempt_fields, finish_log, write_ends
from jobs.execution.context import JobContext, worker_identity
from jobs.execution.heartbeat import HeartbeatLoop
from jobs.execution.limits import SoftLimit
from jobs.execution.run import (
    DB_DOWN,
    DB_DOWN_ERRORS,
    DEFERRED,
    LOST_DECIDING,
    Run,
    probe_release,
    run_claimed,
    run_handler,
)
from jobs.integrations import metrics
from jobs.integrations.wire import payload_version_problem
from jobs.models import Job
from jobs.selectors import ClaimState, job_claim_state
from jobs.services import (
    WORKER,
    Fence,
    Finish,
    HoldReason,
    job_claim,
    job_fail_with_dead_letter,
    job_hold,
)

__all__ = [
    "DB_DOWN_ERRORS",
    "HEARTBEATS",
    "SOFT_LIMIT",
    "Heartbeats",
    "JobContext",
    "Run",
    "attempt_fields",
    "classify",
    "finish_decide",
    "finish_log",
    "job_execute",
    "probe_release",
    "run_handler",
    "worker_identity",
]

logger = structlog.get_logger("jobs.runtime")

# Celery's pool raises the soft time limit in the handler (config/celery.py annotations):
# the core only has to know its class.
SOFT_LIMIT = SoftLimit(SoftTimeLimitExceeded)

# One heartbeat loop per worker process, started on its first job (after the fork).
Heartbeats = HeartbeatLoop
HEARTBEATS = HeartbeatLoop(log=logger)


class _ThreadsPool:
    """What the tasks of a threads-pool worker process share (`configure_pool`): its
    lock holder, its claimer, its completer and its heartbeat loop, which enforces hard
    limits."""

    def __init__(self, *, concurrency: int, hostname: str | None) -> None:
        self.locked_by = worker_identity(hostname)
        # No more claims can wait together than the pool has threads.
        self.claimer = Claimer(batch=concurrency)
        # No more ends can wait together than the pool has threads: a window closes as
        # soon as every thread waits for it.
        self.completer = Completer(batch=concurrency)
        self.heartbeats = HeartbeatLoop(log=logger, hard_limits=True)


THREADS: _ThreadsPool | None = None


def configure_pool(*, threads: bool, concurrency: int, hostname: str | None = None) -> None:
    """Set how this worker process runs its tasks (config/celery.py, at worker init):
    under the threads pool (`threads`), claims and ends batched across the pool's
    `concurrency` tasks and hard limits enforced by the core; otherwise one claim and
    one end per task, each written at once (a prefork child: Celery enforces the
    limits)."""
    global THREADS
    THREADS = _ThreadsPool(concurrency=concurrency, hostname=hostname) if threads else None


# The core's decision with Celery's soft limit (jobs.execution.decide): how a handler's
# exception is classified, and how a run ends.
classify = partial(_decide.classify, time_limit_error=SOFT_LIMIT.error)
finish_decide = partial(_decide.finish_decide, time_limit_error=SOFT_LIMIT.error)


def _payload_job_id(payload: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(payload["job_id"]))
    except (TypeError, KeyError, ValueError):
        return None


# A message without `org_id` (published before tenancy): the row decides alone.
_ABSENT = object()
# Organisation ids are bigint primary keys.
_MAX_ORG_ID = 2**63 - 1


def _payload_org_id(payload: Any) -> Any:
    """The message's `org_id`: `_ABSENT` when it has none, the id when it is one, None
    when it holds anything else (a string, a float, a huge number: not any
    organisation's id, so never the row's)."""
    if not isinstance(payload, dict) or "org_id" not in payload:
        return _ABSENT
    value = payload["org_id"]
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= _MAX_ORG_ID:
        return value
    return None


# The states a claim takes a job from: what a mismatch fails and a hold may hold.
_CLAIMABLE = frozenset({"pending", "queued", "retrying"})


def _requeue_db_down(log: Any, exc: BaseException, **attempt: Any) -> Reject:
    """The database is unreachable: hand the message back, decide nothing. `attempt`:
    the ended attempt's fields (attempt_fields), when a claimed run could not finish."""
    log.error("database_unavailable_requeue", error=repr(exc), **attempt)
    connection.close()
    time.sleep(settings.JOBOPS_DB_DOWN_REQUEUE_DELAY_SECONDS)
    return Reject(f"database unavailable: {exc!r}", requeue=True)


def job_execute(*, payload: Any, hostname: str | None = None) -> dict[str, Any]:
    """Run one delivery of a job's message; see the module docstring for the steps.

    Returns a small summary (Celery stores it as the task result). Raises
    `celery.exceptions.Reject` to reject the message (requeue or not).
    """
    job_id = _payload_job_id(payload)
    log = logger.bind(
        job_id=str(job_id) if job_id else None,
        request_id=(payload or {}).get("request_id") if isinstance(payload, dict) else None,
        correlation_id=(payload or {}).get("correlation_id") if isinstance(payload, dict) else None,
    )
    if job_id is None:
        log.error("message_names_no_job")
        raise Reject("message names no job", requeue=False)
    message_org = _payload_org_id(payload)
    locked_by = THREADS.locked_by if THREADS is not None else worker_identity(hostname)
    try:
        version_problem = payload_version_problem(payload)
        if version_problem is not None:
            return _unsupported_version(job_id=job_id, problem=version_problem, log=log)
        job = None
        if message_org is not None:  # an org_id that is no organisation's claims nothing
            job = _claim(job_id=job_id, locked_by=locked_by, message_org=message_org)
        if job is None:
            return _not_claimed(job_id=job_id, message_org=message_org, log=log)
    except DB_DOWN_ERRORS as exc:
        raise _requeue_db_down(log, exc) from exc
    # Every line of the run (ours, the handler's, Celery's) names the job's tenant, as
    # the row says: the message's org_id has just been checked against it.
    with log_context(org_id=job.org_id, project_id=job.project_id):
        return _run_claimed(job=job, locked_by=locked_by, log=log)


def _claim(*, job_id: uuid.UUID, locked_by: str, message_org: Any) -> Job | None:
    """Step 2's compare-and-set: under the threads pool, the process's claimer claims
    it with the other deliveries starting now (jobs.execution.claim); a message without
    `org_id`, and a prefork child's, claims alone."""
    if message_org is _ABSENT:
        return job_claim(job_id=job_id, locked_by=locked_by)
    if THREADS is not None:
        return THREADS.claimer.claim(job_id=job_id, org_id=message_org, locked_by=locked_by)
    return job_claim(job_id=job_id, locked_by=locked_by, org_id=message_org)


def _not_claimed(*, job_id: uuid.UUID, message_org: Any, log: Any) -> dict[str, Any]:
    """Why the claim matched no row, and what the message's delivery then does.

    1. No such job: reject without requeue (the broker dead-letters the message).
    2. A claimable job whose organisation is not the message's: fail it with a dead
       letter (`TENANT_MISMATCH`, non-retryable), then reject without requeue. The
       handler never runs and no attempt is counted. A job running elsewhere or ended
       is left alone (a stray message must not end someone's run): logged, acked.
    3. A claimable job of a suspended organisation or of a paused queue: a queued one
       is held (`queued -> pending`, `held` with its reason), a pending or retrying one
       stays as it is; acked, no attempt spent. The dispatcher publishes it after the
       organisation's or the queue's `resume`.
    4. Anything else (a duplicate, a stale message, a running job): acked, nothing done.
    """
    dropped = {"job_id": str(job_id), "outcome": "dropped"}
    state = job_claim_state(job_id=job_id)
    if state is None:
        log.error("message_names_unknown_job")
        raise Reject("message names an unknown job", requeue=False)
    log = log.bind(org_id=str(state.org_id))
    if message_org is not _ABSENT and message_org != state.org_id:
        return _tenant_mismatch(job_id=job_id, state=state, message_org=message_org, log=log)
    if (state.org_suspended or state.queue_paused) and state.status in _CLAIMABLE:
        reason = HoldReason.ORG_SUSPENDED if state.org_suspended else HoldReason.QUEUE_PAUSED
        held = state.status == "queued" and job_hold(job_id=job_id, reason=reason, actor=WORKER)
        log.info("job_held", reason=str(reason), status=state.status)
        return {"job_id": str(job_id), "outcome": "held" if held else "dropped"}
    log.info("claim_refused")
    return dropped


def _tenant_mismatch(
    *, job_id: uuid.UUID, state: ClaimState, message_org: Any, log: Any
) -> dict[str, Any]:
    named = "no organisation" if message_org is None else f"organisation {message_org}"
    message = f"the message names {named}; the job is in organisation {state.org_id}"
    return _fail_unclaimed(
        job_id=job_id, state=state, code=TenantMismatchError.code, message=message, log=log
    )


def _unsupported_version(*, job_id: uuid.UUID, problem: str, log: Any) -> dict[str, Any]:
    """A message whose payload version this worker does not read: an unknown job is
    rejected as any other; a claimable one fails with `UNSUPPORTED_VERSION`."""
    state = job_claim_state(job_id=job_id)
    if state is None:
        log.error("message_names_unknown_job", error=problem)
        raise Reject("message names an unknown job", requeue=False)
    code = UnsupportedVersionError.code
    return _fail_unclaimed(job_id=job_id, state=state, code=code, message=problem, log=log)


def _fail_unclaimed(
    *, job_id: uuid.UUID, state: ClaimState, code: str, message: str, log: Any
) -> dict[str, Any]:
    """Fail a job this message must not run, without claiming it (no attempt counted),
    with a non-retryable dead letter; then reject the message without requeue. A job
    running elsewhere or ended is left alone (a stray message must not end someone's
    run): logged, acked."""
    ignored = f"{code.lower()}_ignored"  # tenant_mismatch_ignored, unsupported_version_...
    if state.status not in _CLAIMABLE:
        log.error(ignored, error_code=code, status=state.status)
        return {"job_id": str(job_id), "outcome": "dropped"}
    try:
        job_fail_with_dead_letter(
            job_id=job_id,
            reason="nonretryable",
            actor=WORKER,
            error_code=code,
            error_message=message,
            sources=[state.status],
        )
    except TransitionRefusedError:  # it moved on meanwhile (claimed, cancelled)
        log.error(ignored, error_code=code, status="changed")
        return {"job_id": str(job_id), "outcome": "dropped"}
    log.error("job_dead_lettered", reason="nonretryable", error_code=code, error=message)
    raise Reject(f"nonretryable: {code}", requeue=False)


def _run_claimed(*, job: Job, locked_by: str, log: Any) -> dict[str, Any]:
    """Steps 3 and 4 of the module docstring for a job this delivery claimed: the core
    runs it (jobs.execution.run), its end written at once as a batch of one, or under
    the threads pool in the process's next window (this thread waits for it); here, what
    the delivery answers."""
    job_id = job.id
    threads = THREADS

    def write_end(finish: Finish, run: Run) -> Finish | None:
        """The end as written (its breaker's part resolved), or None: its job was found
        lost, and logged so. Committed when it returns, whichever the pool."""
        end = End(finish, run.ctx.log, job.type)
        if threads is not None:
            return threads.completer.write(end, locked_by=locked_by)
        return write_ends([end], locked_by=locked_by)[0]

    ended = run_claimed(
        job=job,
        fence=Fence(locked_by, job.attempts),
        log=log,
        soft_limit=SOFT_LIMIT,
        heartbeats=threads.heartbeats if threads is not None else HEARTBEATS,
        write_end=write_end,
    )
    run = ended.run
    if run is None:  # the database away before the run began
        assert ended.error is not None
        raise _requeue_db_down(log, ended.error) from ended.error
    seconds = time.monotonic() - run.ctx.started
    if ended.outcome == DB_DOWN:
        # Nothing was decided: the reaper reclaims the job once its lock is stale.
        assert ended.error is not None
        attempt = attempt_fields(job.type, "lost", seconds)
        raise _requeue_db_down(run.ctx.log, ended.error, **attempt) from ended.error
    if ended.outcome == DEFERRED:
        return {"job_id": str(job_id), "outcome": "deferred", "delay": run.gate.delay}
    finish = ended.written  # as written: a failure its connector's breaker holds retries
    if finish is None:
        if ended.finish is None:  # lost before its end was decided (the completer logs its own)
            if ended.outcome == LOST_DECIDING:
                metrics.JOBS_LOST.labels(type=job.type).inc()
            attempt = attempt_fields(job.type, "lost", seconds)
            run.ctx.log.warning("job_lost_stopping", **attempt)
        return {"job_id": str(job_id), "outcome": "lost"}
    summary: dict[str, Any] = {"job_id": str(job_id), "attempt": finish.attempt}
    if finish.target == Status.FAILED:
        # Committed; now the broker copy: reject without requeue -> <q>.dlx -> <q>_dlq.
        raise Reject(f"{finish.reason}: {finish.error_code}", requeue=False)
    if finish.target == Status.RETRYING:
        summary["delay"] = finish.delay
    return {**summary, "outcome": str(finish.target)}
