"""The client's exceptions: every one is a JobOpsError; an answer of the API in its error
envelope (`{"error": {"code", "message", "details"}}`) is an ApiError carrying it."""

from __future__ import annotations

from typing import Any

import httpx


class JobOpsError(Exception):
    """Anything the client raises."""


class ApiError(JobOpsError):
    """The API refused a call: `status` (HTTP), `code` (`ERR-JOB-422`, stable),
    `message` (for people), `details` (per-field errors, `job_id`, `retry_after`, ...),
    `retry_after` (seconds, from the header) and the request's `request_id`."""

    def __init__(
        self,
        *,
        status: int,
        code: str,
        message: str,
        details: dict[str, Any] | None = None,
        retry_after: float | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}
        self.retry_after = retry_after
        self.request_id = request_id

    @classmethod
    def from_envelope(cls, envelope: dict[str, Any], *, status: int = 0) -> ApiError:
        """An item's `error` of a batch answer (no HTTP status of its own: 0)."""
        return cls(
            status=status,
            code=str(envelope.get("code", f"HTTP-{status}")),
            message=str(envelope.get("message", "")),
            details=envelope.get("details") if isinstance(envelope.get("details"), dict) else {},
        )

    @classmethod
    def from_response(cls, response: httpx.Response) -> ApiError:
        """The envelope of `response`; a body that is none (a proxy's HTML page) is
        `HTTP-<status>` with the start of its text."""
        try:
            body = response.json()
            envelope = body["error"]
            if not isinstance(envelope, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            envelope = {"code": f"HTTP-{response.status_code}", "message": response.text[:200]}
        error = cls.from_envelope(envelope, status=response.status_code)
        error.retry_after = retry_after_seconds(response)
        error.request_id = response.headers.get("X-Request-ID")
        return error


class TransportError(JobOpsError):
    """The API could not be reached (or stopped answering) within the attempts allowed."""


class WaitTimeout(JobOpsError, TimeoutError):
    """`wait` ran out of time; `job` is the last state seen (None: none was read)."""

    def __init__(self, message: str, *, job: Any = None) -> None:
        super().__init__(message)
        self.job = job


class ArtefactIntegrityError(JobOpsError):
    """A downloaded artefact's bytes are not the ones the job recorded (sha256 or size);
    the file was deleted."""


class WebhookVerificationError(JobOpsError):
    """A webhook's signature, timestamp or headers do not verify: do not act on it."""


def retry_after_seconds(response: httpx.Response) -> float | None:
    """`Retry-After` in seconds (jobops sends a number of seconds), None when absent or
    not a number."""
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return max(seconds, 0.0)
