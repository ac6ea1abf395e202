"""The handler taxonomy of docs/architecture.md: what a handler raises to choose its outcome.

Retryable errors retry with backoff until the type's max, then dead-letter;
non-retryable and fatal errors fail at once with a dead letter; `JobCancelled` ends the
job `cancelled`. Each carries a `code`, stored as the job's `last_error_code`. What the
services refuse to their callers (API errors) is `jobs.exceptions`.
"""

from __future__ import annotations

# The code of a handler stopped by its type's soft time limit (Celery raises
# SoftTimeLimitExceeded in it). Retryable, but only JOBOPS_TIME_LIMIT_RETRIES times per
# job: work that outgrew its limit once usually does again.
TIME_LIMIT = "TIME_LIMIT"


class JobError(Exception):
    code = "ERR-HANDLER"
    retryable = True

    def __init__(self, message: str = "", *, code: str | None = None) -> None:
        super().__init__(message)
        if code:
            self.code = code


class RetryableError(JobError):
    retryable = True


class TransientExternalError(RetryableError):
    code = "TRANSIENT_EXTERNAL"


class RateLimitedError(RetryableError):
    code = "RATE_LIMITED"


class NetworkError(RetryableError):
    code = "NETWORK"


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
    """The message's payload version is one this worker does not read (`jobs.wire`):
    raised by no handler; the worker fails the job with this code before running it,
    and a replay once a worker that reads it runs brings the job back."""

    code = "UNSUPPORTED_VERSION"


class FatalError(JobError):
    code = "FATAL"
    retryable = False


class ResultInvalidError(FatalError):
    """A handler returned what cannot be stored as the job's result (docs/architecture.md)."""

    code = "RESULT_INVALID"


class JobCancelled(Exception):
    """Raised by ctx.check_cancel(): the job ends `cancelled`, never retried."""
