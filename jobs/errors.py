"""The error taxonomy a handler raises, under the path handler authors import
(docs/architecture.md#the-handler-contract): it lives in `jobs.domain.errors`, with the rest of the
job's rules; this module re-exports it so that `from jobs.errors import ...` keeps
working.
"""

from jobs.domain.errors import (
    TIME_LIMIT,
    FatalError,
    JobCancelled,
    JobError,
    JobValidationError,
    NetworkError,
    NonRetryableError,
    QuotaExceededError,
    RateLimitedError,
    ResultInvalidError,
    RetryableError,
    TenantMismatchError,
    TransientExternalError,
    UnauthorizedError,
    UnsupportedVersionError,
    UploadChecksumError,
    UploadMissingError,
)

__all__ = [
    "TIME_LIMIT",
    "FatalError",
    "JobCancelled",
    "JobError",
    "JobValidationError",
    "NetworkError",
    "NonRetryableError",
    "QuotaExceededError",
    "RateLimitedError",
    "ResultInvalidError",
    "RetryableError",
    "TenantMismatchError",
    "TransientExternalError",
    "UnauthorizedError",
    "UnsupportedVersionError",
    "UploadChecksumError",
    "UploadMissingError",
]
