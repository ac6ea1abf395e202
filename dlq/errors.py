"""Errors of the dead-letter tools; rendered in the API's one envelope (DESIGN.md 6)."""

from __future__ import annotations

from core.errors import ApplicationError


class DeadLetterInputError(ApplicationError):
    code = "ERR-DLQ-400"
    http_status = 400
    default_message = "The dead-letter request is invalid."


class JustificationRequiredError(DeadLetterInputError):
    default_message = "A justification is required to replay or discard dead letters."


class DeadLetterPermissionError(ApplicationError):
    code = "ERR-DLQ-401"
    http_status = 403
    default_message = (
        "Replaying or discarding dead letters needs an active staff user with the "
        "replay_deadletter or discard_deadletter permission."
    )


class UnknownQueueError(ApplicationError):
    code = "ERR-DLQ-404"
    http_status = 404
    default_message = "No such dead-letter queue."
