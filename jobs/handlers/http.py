"""What an HTTP answer from a connector means for the job (docs/connectors.md).

For handlers that call an external system over HTTP (the `erp` reference handler, a
deployment's `ai` provider): `raise_for_answer` turns a status into the error taxonomy
of jobs.errors, carrying the connector's Retry-After on a 429 or 503, so that the job's
next attempt waits at least that long. 5xx are connector failures (they count toward
the connector's breaker), 4xx are not (the connector answered; 429 is retryable).
"""

from __future__ import annotations

from typing import Any

from urllib3.exceptions import InvalidHeader
from urllib3.util.retry import Retry

from jobs.errors import (
    JobValidationError,
    RateLimitedError,
    TransientExternalError,
    UnauthorizedError,
)

# urllib3's parser reads both forms of the header (delta-seconds and an HTTP-date).
_RETRY = Retry()
# Statuses whose Retry-After says when to come back (RFC 9110 10.2.3).
RETRY_AFTER_STATUSES = frozenset({429, 503})


def retry_after_seconds(value: str | None) -> float | None:
    """A Retry-After header in seconds from now (a date in the past: 0); None when
    absent or malformed (a negative number, a fraction, text): the usual backoff
    applies. The worker caps it (JOBOPS_RETRY_AFTER_MAX_SECONDS)."""
    if not value or len(value) > 64:
        return None
    try:
        return float(_RETRY.parse_retry_after(value))
    except (InvalidHeader, ValueError, OverflowError):
        return None


def raise_for_answer(response: Any, *, label: str) -> None:
    """Raise the job error an HTTP answer means; return for a 1xx-3xx. `label` prefixes
    the error codes (`ERP_503`)."""
    status = int(response.status_code)
    wait = (
        retry_after_seconds(response.headers.get("Retry-After"))
        if status in RETRY_AFTER_STATUSES
        else None
    )
    if status == 429:
        raise RateLimitedError(
            f"{label} rate limited the call", code=f"{label}_429", retry_after=wait
        )
    if status in (401, 403):
        raise UnauthorizedError(f"{label} refused: HTTP {status}", code=f"{label}_{status}")
    if 400 <= status < 500:
        raise JobValidationError(
            f"{label} rejected the call: HTTP {status}", code=f"{label}_{status}"
        )
    if status >= 500:
        raise TransientExternalError(
            f"{label} failed: HTTP {status}", code=f"{label}_{status}", retry_after=wait
        )
