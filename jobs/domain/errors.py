"""The handler taxonomy of docs/architecture.md: what a handler raises to choose its outcome.

Retryable errors retry with backoff until the type's max, then dead-letter;
non-retryable and fatal errors fail at once with a dead letter; `JobCancelled` ends the
job `cancelled`. Each carries a `code`, stored as the job's `last_error_code`. What the
services refuse to their callers (API errors) is `jobs.domain.exceptions`.
"""

from __future__ import annotations

import math

# The code of a handler stopped by its type's soft time limit (Celery raises
# SoftTimeLimitExceeded in it). Retryable, but only JOBOPS_TIME_LIMIT_RETRIES times per
# job: work that outgrew its limit once usually does again.
TIME_LIMIT = "TIME_LIMIT"


class JobError(Exception):
    code = "ERR-HANDLER"
    retryable = True
    # The job's connector is failing (a timeout, a 5xx, a refused connection; not a 4xx,
    # which is the connector answering): it counts toward the connector's breaker
    # (docs/connectors.md). Only for a job whose type names a connector.
    connector_failure = False

    def __init__(
        self, message: str = "", *, code: str | None = None, retry_after: float | None = None
    ) -> None:
        """`retry_after`: the least wait, in seconds, before the next attempt (a
        provider's Retry-After); the worker waits at least that long, capped by
        JOBOPS_RETRY_AFTER_MAX_SECONDS. None or a value that is no number of seconds
        from 0 up: the usual backoff."""
        super().__init__(message)
        if code:
            self.code = code
        self.retry_after = _seconds_or_none(retry_after)


def _seconds_or_none(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    seconds = float(value)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


class RetryableError(JobError):
    retryable = True


class TransientExternalError(RetryableError):
    code = "TRANSIENT_EXTERNAL"
    connector_failure = True


class RateLimitedError(RetryableError):
    # A 429 is the connector answering "slower": no connector failure; its Retry-After
    # (`retry_after`) sets the job's next attempt.
    code = "RATE_LIMITED"


class NetworkError(RetryableError):
    code = "NETWORK"
    connector_failure = True


class NonRetryableError(JobError):
    retryable = False


class JobValidationError(NonRetryableError):
    code = "VALIDATION"


class UnauthorizedError(NonRetryableError):
    code = "UNAUTHORIZED"


class QuotaExceededError(NonRetryableError):
    code = "QUOTA_EXCEEDED"


class TenantMismatchError(NonRetryableError):
    """The message names another organisation than the job's row (docs/tenancy.md#execution):
    raised by no handler; the worker fails the job with this code before running it."""

    code = "TENANT_MISMATCH"


class UnsupportedVersionError(NonRetryableError):
    """The message's payload version is one this worker does not read (`jobs.integrations.wire`):
    raised by no handler; the worker fails the job with this code before running it,
    and a replay once a worker that reads it runs brings the job back."""

    code = "UNSUPPORTED_VERSION"


class UploadChecksumError(NonRetryableError):
    """An upload's stored bytes no longer hash to the sha256 taken when it was received
    (docs/api.md#uploading-an-input): changed or corrupted in storage. Nothing of it was
    read; a retry would read the same bytes."""

    code = "UPLOAD_CHECKSUM"


class UploadMissingError(NonRetryableError):
    """The upload a job names is gone (its row, or its bytes from storage)."""

    code = "UPLOAD_MISSING"


class FatalError(JobError):
    code = "FATAL"
    retryable = False


class ResultInvalidError(FatalError):
    """A handler returned what cannot be stored as the job's result (docs/architecture.md)."""

    code = "RESULT_INVALID"


class ProgressMetricsError(FatalError):
    """A handler passed `ctx.progress(..., metrics=...)` what the bounds refuse
    (jobs.domain.progress): a mistake in the handler, which no retry corrects."""

    code = "PROGRESS_METRICS_INVALID"


class JobCancelled(Exception):
    """Raised by ctx.check_cancel(): the job ends `cancelled`, never retried."""


# --- the class of a failure (the `error_class` metric label) ---------------------------
# The taxonomy's classes a job can fail in (docs/architecture.md#outcomes-of-a-run); a
# cancellation is no failure. A label takes only these: a failure the taxonomy does not
# classify (a broker's dead letter: rejected, expired, maxlen, delivery_limit) is OTHER.
FAILURE_CLASSES = ("retryable", "nonretryable", "fatal", "time_limit", "worker_lost", "other")
OTHER_FAILURE = "other"
# A dead letter's reason -> the class of the error that made it, for the reasons the
# taxonomy decides (jobs.domain.choices.DeadLetterReason); retries used up ("exhausted")
# end a retryable error.
_CLASS_OF_REASON = {
    "exhausted": "retryable",
    "nonretryable": "nonretryable",
    "fatal": "fatal",
    "worker_lost": "worker_lost",
}


def failure_class(*, reason: str | None, error_code: str | None) -> str:
    """The taxonomy's class of a job's failure, from its dead letter's `reason` and its
    last error code: a soft time limit is `time_limit` whether it was retried until the
    attempts ran out or not retried again; anything else unknown is `other`. Derived
    from what the failure recorded, so a handler's own code (ERP_503) classes by how
    it failed, and no code can add a class."""
    if error_code == TIME_LIMIT:
        return "time_limit"
    return _CLASS_OF_REASON.get(reason or "", OTHER_FAILURE)
