"""Errors: the API-facing `ApplicationError` hierarchy and the handler taxonomy (DESIGN.md 3.3).

`ApplicationError` subclasses carry a machine-readable `code` and an `http_status`;
one DRF exception handler renders them in the envelope of DESIGN.md 6. Handler
errors carry a `code` too, stored as the job's `last_error_code`.
"""

from __future__ import annotations

from typing import Any


class ApplicationError(Exception):
    code = "ERR-APP"
    http_status = 400
    default_message = "The request could not be processed."

    def __init__(self, message: str | None = None, *, details: Any = None) -> None:
        self.message = message or self.default_message
        self.details = details if details is not None else {}
        super().__init__(self.message)


class JobTypeUnknownError(ApplicationError):
    code = "ERR-JOB-400"
    http_status = 400


class BadRequestError(ApplicationError):
    code = "ERR-JOB-400"
    http_status = 400


class IdempotencyKeyInvalidError(ApplicationError):
    code = "ERR-JOB-400"
    http_status = 400


class JobParamsInvalidError(ApplicationError):
    code = "ERR-JOB-422"
    http_status = 422
    default_message = "The job's params do not match its type's schema."


class IdempotencyMismatchError(ApplicationError):
    code = "ERR-JOB-IDEMPOTENCY-MISMATCH"
    http_status = 422
    default_message = "This idempotency key was already used with a different type or params."


class JobConflictError(ApplicationError):
    code = "ERR-JOB-409"
    http_status = 409
    default_message = "The job changed concurrently; retry the request."


class PayloadTooLargeError(ApplicationError):
    code = "ERR-JOB-413"
    http_status = 413


class JobNotFoundError(ApplicationError):
    code = "ERR-JOB-404"
    http_status = 404
    default_message = "No such job."


class TransitionRefusedError(JobConflictError):
    """A transition that DESIGN.md 3.4 does not allow, or that lost its race."""

    def __init__(self, *, job_id: Any, current: str | None, target: str, reason: str = "") -> None:
        self.job_id, self.current, self.target = job_id, current, target
        message = f"job {job_id}: transition {current} -> {target} refused"
        super().__init__(
            message + (f" ({reason})" if reason else ""),
            details={"job_id": str(job_id), "status": current, "attempted": target},
        )


class JobLost(Exception):
    """A fenced worker write matched no row: the job was reclaimed from under the worker."""


# --- handler taxonomy (DESIGN.md 3.3) -------------------------------------------


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


class FatalError(JobError):
    code = "FATAL"
    retryable = False


class ResultInvalidError(FatalError):
    """A handler returned what cannot be stored as the job's result (DESIGN.md 3.3)."""

    code = "RESULT_INVALID"


class JobCancelled(Exception):
    """Raised by ctx.check_cancel(): the job ends `cancelled`, never retried."""
