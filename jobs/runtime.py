"""Running one job inside a worker: the claim, the handler contract and its outcomes.

`job_execute` is what every Celery task `jobs.<type>` calls (docs/architecture.md):

1. Decode the wire payload; a message that names no job is rejected without requeue
   (the broker dead-letters it and the watcher records it with a null job). A payload
   version this worker does not read (`jobs.wire`) fails a claimable job with an
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
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from typing import IO, Any, NamedTuple

import structlog
from celery.exceptions import Reject, SoftTimeLimitExceeded
from django.conf import settings
from django.db import IntegrityError, InterfaceError, OperationalError, connection

from core.logging import log_context
from jobs import metrics
from jobs.errors import (
    TIME_LIMIT,
    FatalError,
    JobCancelled,
    JobError,
    TenantMismatchError,
    UnsupportedVersionError,
)
from jobs.exceptions import JobLost, TransitionRefusedError
from jobs.models import Artefact, Job
from jobs.selectors import ClaimState, job_claim_state, job_time_limit_retries
from jobs.services import (
    WORKER,
    Fence,
    Finish,
    HoldReason,
    artefact_save,
    job_claim,
    job_fail_with_dead_letter,
    job_finish,
    job_heartbeat,
    job_hold,
    job_lock_state,
    job_progress_write,
    retry_delay,
    validate_result,
)
from jobs.services.connectors import (
    Gate,
    connector_failure_record,
    connector_gate,
    connector_probe_release,
    connector_success_record,
)
from jobs.states import Status
from jobs.types import JobType, get_type
from jobs.wire import payload_version_problem

logger = structlog.get_logger("jobs.runtime")

# The database could not be reached: nothing may be decided without it.
DB_DOWN_ERRORS = (OperationalError, InterfaceError)


class JobContext:
    """What a handler gets (docs/architecture.md): `handler(ctx, params) -> dict | None`."""

    def __init__(self, *, job: Job, fence: Fence, log: Any) -> None:
        self.job_id = job.id
        self.job_type = job.type
        # Handlers read and write only this owner's data (a report lists their jobs),
        # and never outside the job's tenant (docs/tenancy.md#execution).
        self.owner_id = job.owner_id
        self._org_id: int = job.org_id
        self._project_id: int | None = job.project_id
        self.attempt = fence.attempt
        # Stable across attempts: external systems recognise a repeated side effect.
        self.idempotency_key = str(job.id)
        self.log = log
        self._fence = fence
        self._lock = threading.Lock()
        self._lost = threading.Event()
        self._cancel_seen = bool(job.cancel_requested)
        self._percent = int(job.progress_percent or 0)
        self._pending: dict[str, Any] | None = None
        self._last_write = float("-inf")
        self._last_cancel_check = time.monotonic()
        self.started = time.monotonic()  # the attempt's start (its claim): its duration

    @property
    def org_id(self) -> int:
        """The job's organisation (read-only: a handler cannot step into another)."""
        return self._org_id

    @property
    def project_id(self) -> int | None:
        """The job's project within its organisation, if it has one (read-only)."""
        return self._project_id

    # --- the handler API ------------------------------------------------------------
    def progress(self, percent: float, step: str | None = None, message: str | None = None) -> None:
        """Report progress: monotonic within the attempt (never goes back; the claim
        started it from zero), coalesced to one write per JOBOPS_PROGRESS_INTERVAL_SECONDS;
        the last value is always flushed with the final transition."""
        self._ensure_alive()
        with self._lock:
            self._percent = max(self._percent, max(0, min(100, int(percent))))
            self._pending = {"percent": self._percent, "step": step, "message": message}
        self._flush_if_due()

    def check_cancel(self) -> None:
        """Raise JobCancelled if cancellation was requested (reads the flag by primary
        key at most every JOBOPS_CANCEL_CHECK_SECONDS; the heartbeat also brings it)."""
        self._ensure_alive()
        if not self._cancel_seen:
            now = time.monotonic()
            if now - self._last_cancel_check >= settings.JOBOPS_CANCEL_CHECK_SECONDS:
                self._last_cancel_check = now
                self._cancel_seen = job_lock_state(job_id=self.job_id, fence=self._fence)
        if self._cancel_seen:
            raise JobCancelled(f"job {self.job_id}: cancellation requested")

    def save_artefact(
        self,
        kind: str,
        name: str,
        data: bytes | str | IO[bytes],
        content_type: str = "application/octet-stream",
    ) -> Artefact:
        """Upsert a file on (job, kind, name); refused (JobLost) once the lock is gone."""
        self._ensure_alive()
        return artefact_save(
            job_id=self.job_id,
            kind=kind,
            name=name,
            data=data,
            content_type=content_type,
            fence=self._fence,
        )

    def cancel_requested(self) -> bool:
        """Whether cancellation was requested, read from the database now."""
        if not self._cancel_seen:
            self._cancel_seen = job_lock_state(job_id=self.job_id, fence=self._fence)
        return self._cancel_seen

    # --- runtime internals ------------------------------------------------------------
    def _ensure_alive(self) -> None:
        if self._lost.is_set():
            raise JobLost(f"job {self.job_id}: lock lost")

    def _flush_if_due(self, *, force: bool = False) -> None:
        with self._lock:
            due = time.monotonic() - self._last_write >= settings.JOBOPS_PROGRESS_INTERVAL_SECONDS
            if self._pending is None or not (due or force):
                return
            value, self._pending = self._pending, None
            self._last_write = time.monotonic()
        try:
            job_progress_write(job_id=self.job_id, fence=self._fence, **value)
        except JobLost:
            self._lost.set()
            raise

    def take_pending_progress(self) -> dict[str, Any] | None:
        """The unwritten progress value, for the final transition to carry."""
        with self._lock:
            value, self._pending = self._pending, None
            return value


class Heartbeats:
    """One thread per worker process that keeps the locks of the jobs it runs alive.

    Every JOBOPS_HEARTBEAT_SECONDS after its claim, each running job's lock is refreshed
    (fenced), its cancel flag read, and a coalesced progress value its handler left
    waiting is flushed. One long-lived thread (started on first use, after the pool
    forked) with its own database connection, rather than a thread per job: a short
    job then costs no thread start and join, and a beat no new connection.

    The thread never sleeps longer than one heartbeat, so a job added now (first beat
    one heartbeat from now) is always due after the thread's next wake-up: `add` need
    not wake it. A wake-up per job was a thread switch and a fight for the GIL with
    the job itself, for nothing, on every short job.
    """

    def __init__(self) -> None:
        self._jobs: dict[Any, tuple[JobContext, float]] = {}  # job id -> (ctx, next beat)
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def add(self, ctx: JobContext) -> None:
        with self._changed:
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()  # a thread does not survive a fork: start anew
                self._thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)
                self._thread.start()
            due = time.monotonic() + settings.JOBOPS_HEARTBEAT_SECONDS
            self._jobs[ctx.job_id] = (ctx, due)

    def remove(self, ctx: JobContext) -> None:
        """No beat for this job any more. A beat already under way is fenced: once the
        job has left `running` it matches no row and is ignored."""
        with self._changed:
            self._jobs.pop(ctx.job_id, None)

    def _run(self) -> None:
        while True:
            with self._changed:
                now = time.monotonic()
                due = [ctx for ctx, at in self._jobs.values() if at <= now]
                for ctx in due:
                    self._jobs[ctx.job_id] = (ctx, now + settings.JOBOPS_HEARTBEAT_SECONDS)
                if not due:
                    latest = now + settings.JOBOPS_HEARTBEAT_SECONDS
                    soonest = min((at for _, at in self._jobs.values()), default=latest)
                    self._changed.wait(timeout=max(0.0, min(soonest, latest) - now))
                    continue
            for ctx in due:
                self._beat(ctx)

    def _beat(self, ctx: JobContext) -> None:
        try:
            if job_heartbeat(job_id=ctx.job_id, fence=ctx._fence):
                ctx._cancel_seen = True
            ctx._flush_if_due()
        except JobLost:
            with self._changed:
                running = self._jobs.pop(ctx.job_id, None) is not None
            if running:  # not a job that just ended while its beat was on the way
                ctx._lost.set()
                ctx.log.warning("job_lock_lost")
        except Exception as exc:
            # A database blip: the next beat tries again (the lock may go stale, then
            # the reaper reclaims the job and our writes are refused).
            ctx.log.warning("heartbeat_failed", error=repr(exc))
            connection.close()  # this thread's own connection


HEARTBEATS = Heartbeats()


def worker_identity(hostname: str | None = None) -> str:
    """A lock holder name unique per claim: host, process and a random suffix."""
    return f"{hostname or socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


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


def classify(exc: BaseException) -> tuple[str, str]:
    """(outcome, error_code) for a handler's exception (docs/architecture.md#outcomes-of-a-run)."""
    if isinstance(exc, SoftTimeLimitExceeded):
        return "retry", TIME_LIMIT
    if isinstance(exc, FatalError | IntegrityError):
        return "fatal", getattr(exc, "code", "INTEGRITY")
    if isinstance(exc, JobError):
        return ("retry" if exc.retryable else "nonretryable"), exc.code
    return "retry", f"UNEXPECTED_{type(exc).__name__}"[:64]


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
    locked_by = worker_identity(hostname)
    try:
        version_problem = payload_version_problem(payload)
        if version_problem is not None:
            return _unsupported_version(job_id=job_id, problem=version_problem, log=log)
        job = None
        if message_org is not None:  # an org_id that is no organisation's claims nothing
            org_id = None if message_org is _ABSENT else message_org
            job = job_claim(job_id=job_id, locked_by=locked_by, org_id=org_id)
        if job is None:
            return _not_claimed(job_id=job_id, message_org=message_org, log=log)
    except DB_DOWN_ERRORS as exc:
        raise _requeue_db_down(log, exc) from exc
    # Every line of the run (ours, the handler's, Celery's) names the job's tenant, as
    # the row says: the message's org_id has just been checked against it.
    with log_context(org_id=job.org_id, project_id=job.project_id):
        return _run_claimed(job=job, locked_by=locked_by, log=log)


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
    """Steps 3 and 4 of the module docstring for a job this delivery claimed."""
    job_id = job.id
    fence = Fence(locked_by, job.attempts)
    try:
        run = run_handler(job=job, fence=fence, log=log, heartbeats=HEARTBEATS)
    except DB_DOWN_ERRORS as exc:
        raise _requeue_db_down(log, exc) from exc
    ctx = run.ctx
    log = ctx.log

    def lost() -> dict[str, Any]:
        seconds = time.monotonic() - ctx.started
        log.warning("job_lost_stopping", **attempt_fields(job.type, "lost", seconds))
        return {"job_id": str(job_id), "outcome": "lost"}

    try:
        if run.outcome == "deferred":
            return {"job_id": str(job_id), "outcome": "deferred", "delay": run.gate.delay}
        if run.outcome == "lost" or ctx._lost.is_set():
            return lost()
        return _finish(run, job)
    except JobLost:
        metrics.JOBS_LOST.labels(type=job.type).inc()
        return lost()
    except DB_DOWN_ERRORS as exc:
        # Nothing was decided: the reaper reclaims the job once its lock is stale.
        seconds = time.monotonic() - ctx.started
        raise _requeue_db_down(log, exc, **attempt_fields(job.type, "lost", seconds)) from exc
    finally:
        probe_release(run.gate, job_id=job_id, log=log)


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


def run_handler(*, job: Job, fence: Fence, log: Any, heartbeats: Heartbeats | None) -> Run:
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
    log.info("job_started")
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


def _finish(run: Run, job: Job) -> dict[str, Any]:
    ctx = run.ctx
    finish = finish_decide(
        ctx=ctx, job=job, spec=run.spec, outcome=run.outcome, error=run.error, result=run.result
    )
    job_finish(finish=finish, fence=ctx._fence)
    finish_log(ctx.log, finish)
    summary: dict[str, Any] = {"job_id": str(job.id), "attempt": finish.attempt}
    if finish.target == Status.FAILED:
        # Committed; now the broker copy: reject without requeue -> <q>.dlx -> <q>_dlq.
        raise Reject(f"{finish.reason}: {finish.error_code}", requeue=False)
    if finish.target == Status.RETRYING:
        summary["delay"] = finish.delay
    return {**summary, "outcome": str(finish.target)}


def finish_decide(
    *,
    ctx: JobContext,
    job: Job,
    spec: JobType,
    outcome: str,
    error: BaseException | None,
    result: dict[str, Any] | None,
) -> Finish:
    """How a run ends (docs/architecture.md#outcomes-of-a-run), for both executors to
    write: succeeded; cancelled (also an error after a cancel request: the user asked
    to stop); an error classified (`classify`) as a retry with a jittered backoff while
    attempts remain (a soft time limit only JOBOPS_TIME_LIMIT_RETRIES times per job),
    else failed with its dead letter's reason. The job's connector's breaker hears of
    the outcome here (a success, a connector failure), as the run ends."""
    attempt, progress = ctx._fence.attempt, ctx.take_pending_progress()
    # Every end says its type and how long the attempt ran (finish_log).
    own: dict[str, Any] = {"job_type": job.type, "seconds": time.monotonic() - ctx.started}
    if outcome == "succeeded":
        # The connector answered (docs/connectors.md): its failure count goes back to
        # 0, and the half-open breaker this job probed closes.
        connector_success_record(spec=spec, job_id=job.id)
        return Finish(job.id, attempt, Status.SUCCEEDED, result=result, progress=progress, **own)
    if outcome == "cancelled":
        return Finish(job.id, attempt, Status.CANCELLED, progress=progress, **own)
    assert error is not None
    kind, code = classify(error)
    message = f"{type(error).__name__}: {error}"[:2000]
    if ctx.cancel_requested():
        # The user asked to stop: a failure after that ends the job as they asked, not
        # as a retry or a dead letter someone would have to discard.
        return Finish(job.id, attempt, Status.CANCELLED, error_code=code, progress=progress, **own)
    if isinstance(error, SoftTimeLimitExceeded):
        kind, message = _time_limit_outcome(job=job, spec=spec, attempt=attempt)
    # A connector failure counts toward its breaker (docs/connectors.md); once the
    # breaker holds the connector's jobs, this one waits for the probe too, and is not
    # dead-lettered for an outage the breaker saw.
    seen = (
        connector_failure_record(spec=spec, job_id=job.id, error=error) if kind == "retry" else None
    )
    held = seen is not None and seen.holds_jobs
    if kind == "retry" and (attempt < job.max_attempts or held):
        delay = retry_delay(
            attempt=attempt, cap=spec.backoff_cap, retry_after=getattr(error, "retry_after", None)
        )
        if seen is not None and held:
            delay = max(delay, seen.wait)
        return Finish(
            job.id,
            attempt,
            Status.RETRYING,
            error_code=code,
            error_message=message,
            delay=delay,
            progress=progress,
            breaker=seen.state if seen is not None and held else None,
            extend_attempts=1 if held and attempt >= job.max_attempts else 0,
            **own,
        )
    reason = {"retry": "exhausted", "fatal": "fatal", "nonretryable": "nonretryable"}[kind]
    return Finish(
        job.id,
        attempt,
        Status.FAILED,
        error_code=code,
        error_message=message,
        reason=reason,
        progress=progress,
        **own,
    )


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


def _time_limit_outcome(*, job: Job, spec: JobType, attempt: int) -> tuple[str, str]:
    """(kind, message) of an attempt stopped by its soft time limit: retried while the
    job has had fewer than JOBOPS_TIME_LIMIT_RETRIES time-limit retries, else
    non-retryable. Work that ran past its limit twice would do so on every attempt,
    each holding a slot of the queue for the whole limit."""
    limit = f"the {spec.name} type's soft time limit of {spec.soft_time_limit} s"
    allowed = settings.JOBOPS_TIME_LIMIT_RETRIES
    earlier = job_time_limit_retries(job_id=job.id)
    if earlier < allowed:
        times = "once" if allowed == 1 else f"at most {allowed} times"
        return "retry", f"attempt {attempt} ran past {limit} (retried {times} per job)"
    return "nonretryable", (
        f"attempt {attempt} ran past {limit}, after {earlier} time-limit "
        f"{'retry' if earlier == 1 else 'retries'}: not retried again "
        "(give the job less work, or raise its type's time limit)"
    )
