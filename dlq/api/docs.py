"""OpenAPI documentation of the admin DLQ API: its error table (docs/api.md#errors)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse

from core.api.docs import ErrorTable, error_responses_from, response_header

# status -> (description, codes that status can carry)
ERRORS: ErrorTable = {
    400: (
        "ERR-DLQ-400: a malformed request: not JSON, not an object, an unknown field, a "
        "field of the wrong type or out of range, a bad query parameter.",
        ["ERR-DLQ-400"],
    ),
    401: (
        "ERR-DLQ-401: not active staff with a verified OTP. Use an OTP-verified admin "
        "session, or a token holding a live grant from `POST /api/v1/admin/otp`.",
        ["ERR-DLQ-401"],
    ),
    403: (
        "ERR-DLQ-403: OTP-verified staff without the operator's permission for this write "
        "(jobs.replay_deadletter, jobs.discard_deadletter, or jobs.pause_queue for a queue's "
        "pause or resume, which staff limited to some organisations are refused too). "
        "ERR-AUTH-403: a session "
        "request without its CSRF token, or a token without the admin:dlq scope.",
        ["ERR-DLQ-403", "ERR-AUTH-403"],
    ),
    404: (
        "ERR-DLQ-404: no such dead-letter queue, queue or bulk operation.",
        ["ERR-DLQ-404"],
    ),
    409: (
        "ERR-DLQ-409: a peek of the DLQ of a queue the postgres executor runs: it has no "
        "broker DLQ, its dead letters are the database rows; or a fix-forward conflict.",
        ["ERR-DLQ-409"],
    ),
    415: ("ERR-HTTP-415: the body is not `application/json`.", ["ERR-HTTP-415"]),
    422: (
        "ERR-DLQ-422: a selection the service refuses (job ids without any dead letter in "
        "this queue, a bad filter) or, for a replay or discard that is not a dry run, a "
        "missing or blank justification.",
        ["ERR-DLQ-422"],
    ),
    429: (
        "ERR-DLQ-429: more than 30 admin calls a minute (JOBOPS_RATE_LIMITS.admin_dlq); "
        "see Retry-After.",
        ["ERR-DLQ-429"],
    ),
    503: ("ERR-DLQ-503: RabbitMQ cannot be reached; retry shortly.", ["ERR-DLQ-503"]),
}


def error_responses(*statuses: int) -> dict[int, OpenApiResponse]:
    return error_responses_from(ERRORS, *statuses)


RETRY_AFTER = response_header("Retry-After", "Seconds to wait before retrying.", [429, 503])
