"""How a run ends (docs/architecture.md#outcomes-of-a-run): the decision both executors
take once a handler returned or raised, before the completer writes it."""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.db import IntegrityError

from jobs.domain.errors import TIME_LIMIT, FatalError, JobError
from jobs.domain.states import Status
from jobs.domain.types import JobType
from jobs.execution.context import JobContext
from jobs.models import Job
from jobs.selectors import job_time_limit_retries
from jobs.services import Finish, retry_delay
from jobs.services.connectors import connector_of, failure_code


def classify(exc: BaseException, *, time_limit_error: type[BaseException]) -> tuple[str, str]:
    """(outcome, error_code) for a handler's exception (docs/architecture.md#outcomes-of-a-run);
    `time_limit_error`: the soft limit's exception class (jobs.execution.limits)."""
    if isinstance(exc, time_limit_error):
        return "retry", TIME_LIMIT
    if isinstance(exc, FatalError | IntegrityError):
        return "fatal", getattr(exc, "code", "INTEGRITY")
    if isinstance(exc, JobError):
        return ("retry" if exc.retryable else "nonretryable"), exc.code
    return "retry", f"UNEXPECTED_{type(exc).__name__}"[:64]


def finish_decide(
    *,
    ctx: JobContext,
    job: Job,
    spec: JobType,
    outcome: str,
    error: BaseException | None,
    result: dict[str, Any] | None,
    time_limit_error: type[BaseException],
) -> Finish:
    """How a run ends (docs/architecture.md#outcomes-of-a-run), for both executors to
    write: succeeded; cancelled (also an error after a cancel request: the user asked
    to stop); an error classified (`classify`) as a retry with a jittered backoff while
    attempts remain (a soft time limit only JOBOPS_TIME_LIMIT_RETRIES times per job),
    else failed with its dead letter's reason (`time_limit_error`: the soft limit's
    exception class, jobs.execution.limits). The breaker is not read here: an end its
    job's connector's breaker counts (a success, a connector failure) names the
    connector, and the completer counts it and resolves what depends on the breaker (a
    connector failure held for its probe instead of its backoff or its dead letter:
    jobs.services.completion)."""
    attempt, progress = ctx._fence.attempt, ctx.take_pending_progress()
    # Every end says its type and how long the attempt ran (finish_log).
    own: dict[str, Any] = {"job_type": job.type, "seconds": time.monotonic() - ctx.started}
    # The breaker its gate chose (a provider's, for a connector with providers), else
    # its type's connector's.
    connector = ctx.provider if ctx.provider is not None else connector_of(spec.name)
    if connector is not None and connector.provider is not None:
        own["provider"] = connector.provider  # its end's entry says who ran it
    if outcome == "succeeded":
        # The connector answered (docs/connectors.md): its breaker's count goes back to
        # 0, and the half-open breaker this job probed closes.
        if connector is not None:
            own["connector"] = connector.name
        return Finish(job.id, attempt, Status.SUCCEEDED, result=result, progress=progress, **own)
    if outcome == "cancelled":
        return Finish(job.id, attempt, Status.CANCELLED, progress=progress, **own)
    assert error is not None
    kind, code = classify(error, time_limit_error=time_limit_error)
    message = f"{type(error).__name__}: {error}"[:2000]
    if ctx.cancel_requested():
        # The user asked to stop: a failure after that ends the job as they asked, not
        # as a retry or a dead letter someone would have to discard.
        return Finish(job.id, attempt, Status.CANCELLED, error_code=code, progress=progress, **own)
    if isinstance(error, time_limit_error):
        kind, message = _time_limit_outcome(job=job, spec=spec, attempt=attempt)
    # A connector failure counts toward its breaker (docs/connectors.md): should the
    # breaker hold its connector's jobs once it is counted, this one waits for the probe
    # too, and is not dead-lettered for an outage the breaker saw.
    breaker_code = failure_code(error) if kind == "retry" and connector is not None else None
    if connector is not None and breaker_code is not None:
        own |= {"connector": connector.name, "connector_error": breaker_code}
    if kind == "retry" and (attempt < job.max_attempts or breaker_code is not None):
        delay = retry_delay(
            attempt=attempt, cap=spec.backoff_cap, retry_after=getattr(error, "retry_after", None)
        )
        if attempt < job.max_attempts:
            return Finish(
                job.id,
                attempt,
                Status.RETRYING,
                error_code=code,
                error_message=message,
                delay=delay,
                progress=progress,
                **own,
            )
        own["delay"] = delay  # its wait, should its breaker hold it (no dead letter then)
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
