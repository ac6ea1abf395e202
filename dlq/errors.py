"""Errors of the dead-letter tools; rendered in the API's one envelope (docs/api.md#errors).

The codes are those of docs/api.md#errors for the admin calls: 401 not staff with a verified OTP,
403 verified but without the operator's permission, 404 unknown queue or operation,
422 a selection or justification the service refuses, 429 too many admin calls.
Malformed requests (a body that is not JSON, a field of the wrong type) are DRF's
validation errors, answered 400 `ERR-DLQ-400` through the views' `error_prefix`.
"""

from __future__ import annotations

from core.errors import ApplicationError


class DeadLetterInputError(ApplicationError):
    code = "ERR-DLQ-422"
    http_status = 422
    default_message = "The dead-letter selection is invalid."


class JobsFilterInvalidError(DeadLetterInputError):
    """A cancel-by-filter whose filter no job can match or that exceeds a bound."""


class JustificationRequiredError(DeadLetterInputError):
    default_message = "A justification is required to replay or discard dead letters."


class DeadLetterNotVerifiedError(ApplicationError):
    code = "ERR-DLQ-401"
    http_status = 401
    default_message = (
        "Dead-letter calls need an active staff user with a verified one-time password: "
        "an OTP-verified admin session, or a token holding a live grant from "
        "POST /api/v1/admin/otp."
    )
    headers = {"WWW-Authenticate": 'Token realm="jobops admin"'}


class DeadLetterPermissionError(ApplicationError):
    code = "ERR-DLQ-403"
    http_status = 403
    default_message = (
        "Replaying or discarding dead letters needs an active staff user with the "
        "replay_deadletter or discard_deadletter permission (the operator role)."
    )


class DeadLetterWholeQueueError(DeadLetterPermissionError):
    """A staff member limited to some organisations asked for a replay or discard that
    names no rows (a whole queue, or everything a filter matches): such controls act
    on every tenant at once and stay with unrestricted operators."""

    default_message = (
        "You are limited to some organisations: name the dead letters (ids or jobs) to "
        "replay or discard; whole-queue actions need an unrestricted operator."
    )


class DeadLetterNotFoundError(ApplicationError):
    """Dead letters (or their jobs) the caller may not see: outside a limited
    operator's organisations, they are answered as if they did not exist."""

    code = "ERR-DLQ-404"
    http_status = 404
    default_message = "No such dead letter."


class UnknownQueueError(ApplicationError):
    code = "ERR-DLQ-404"
    http_status = 404
    default_message = "No such dead-letter queue."


class BulkOperationNotFoundError(ApplicationError):
    code = "ERR-DLQ-404"
    http_status = 404
    default_message = "No such bulk operation."


class DeadLetterRateLimitedError(ApplicationError):
    code = "ERR-DLQ-429"
    http_status = 429
    default_message = "Too many admin calls; retry after Retry-After seconds."

    def __init__(self, *, retry_after: int) -> None:
        super().__init__(details={"retry_after": retry_after})
        self.retry_after = retry_after


class NoBrokerDlqError(ApplicationError):
    """A peek of the DLQ of a queue the postgres executor runs: it has no broker copy."""

    code = "ERR-DLQ-409"
    http_status = 409
    default_message = (
        "This queue runs on the postgres executor: it has no broker DLQ, its dead letters "
        "are the database rows (GET /api/v1/admin/dlq counts them; replay and discard work)."
    )


class BrokerUnavailableError(ApplicationError):
    code = "ERR-DLQ-503"
    http_status = 503
    default_message = "RabbitMQ cannot be reached; retry shortly."
    retry_after = 5


class OrganisationNotFoundError(ApplicationError):
    """A cancel by filter naming an organisation the caller may not act on (or none):
    answered as if it did not exist, like any other organisation's rows."""

    code = "ERR-DLQ-404"
    http_status = 404
    default_message = "No such organisation."


class FixForwardInputError(DeadLetterInputError):
    """New params that are no change, or a reason missing or too long."""

    default_message = "The edited params or the reason are invalid."


class FixForwardConflictError(ApplicationError):
    """The edit cannot apply any more: its dead letter was resolved, its job is no
    longer failed or its params changed since the edit was requested, or the edit was
    decided already."""

    code = "ERR-DLQ-409"
    http_status = 409
    default_message = "The dead letter or its job changed since; start the edit again."


class FourEyesError(DeadLetterPermissionError):
    default_message = "An edited replay needs a second operator: its requester cannot approve it."
