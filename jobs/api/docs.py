"""OpenAPI documentation pieces for the jobs API: its error table and rate-limit headers.

Kept apart from the views so that each view's decorator reads as a list of what it
can answer. Every status code and error code the API emits is listed here.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse

from core.api.docs import ErrorTable, error_responses_from, response_header

# status -> (description, codes that status can carry)
ERRORS: ErrorTable = {
    400: (
        "ERR-JOB-400: unknown job type; idempotency key longer than 255 characters or not "
        "printable ASCII, or body and Idempotency-Key header disagree; malformed JSON; a body "
        "that is not a JSON object; unknown or mistyped top-level fields; bad filters.",
        ["ERR-JOB-400"],
    ),
    401: (
        "ERR-AUTH-401: no or invalid credentials (send `Authorization: Token ...` or "
        "`Bearer ...`), or the token expired or was revoked.",
        ["ERR-AUTH-401"],
    ),
    403: (
        "ERR-AUTH-403: refused, e.g. a session request without its CSRF token, or a token "
        "without the operation's scope (details.required_scope). "
        "ERR-TENANT-SUSPENDED: the organisation is suspended (no new jobs). "
        "ERR-TENANT-403: the caller is a member of no organisation.",
        ["ERR-AUTH-403", "ERR-TENANT-SUSPENDED", "ERR-TENANT-403"],
    ),
    404: (
        "ERR-JOB-404: no such job, artefact or upload, or the caller may not see it (another "
        "organisation's, or another member's: docs/tenancy.md#visibility).",
        ["ERR-JOB-404"],
    ),
    409: (
        "ERR-JOB-409: a concurrent change conflicted; the request can be retried. "
        "ERR-CONNECTOR-OPEN (create only, for a type that opted in): the external system "
        "the type calls is failing (its breaker is open: docs/connectors.md); retry after "
        "Retry-After seconds.",
        ["ERR-JOB-409", "ERR-CONNECTOR-OPEN"],
    ),
    413: (
        "ERR-JOB-413: the request body or the params exceed 256 KB; a batch create's body "
        "exceeds JOBOPS_BATCH_MAX_BYTES (4 MB) or holds more than JOBOPS_BATCH_CREATE_MAX "
        "(1,000) jobs; an upload exceeds JOBOPS_UPLOAD_MAX_BYTES.",
        ["ERR-JOB-413"],
    ),
    415: (
        "ERR-HTTP-415: the body is not `application/json` (an upload: not "
        "`multipart/form-data`, or a file of a type uploads do not accept).",
        ["ERR-HTTP-415"],
    ),
    422: (
        "ERR-JOB-422: params do not match the type's schema (per-field details). "
        "ERR-JOB-PARAMS-SECRET: params hold a secret (a key named like one, or a value "
        "shaped like a private key, a bearer token or an AWS access key id); details name "
        "each JSON path, never the value. "
        "ERR-JOB-IDEMPOTENCY-MISMATCH: the key was used before with another type or params. "
        "ERR-TENANT-422: no organisation named by a caller in several, or one that is not "
        "the caller's, or a project of another organisation. ERR-JOB-422 (upload): a "
        "file that says nothing of its type (no Content-Type, extension or format).",
        ["ERR-JOB-422", "ERR-JOB-PARAMS-SECRET", "ERR-JOB-IDEMPOTENCY-MISMATCH", "ERR-TENANT-422"],
    ),
    429: (
        "ERR-JOB-RATE-LIMIT: too many submissions (60/min per user, 500/min overall by default). "
        "ERR-JOB-BACKPRESSURE: the type's queue is deeper than its limit. Both send Retry-After.",
        ["ERR-JOB-RATE-LIMIT", "ERR-JOB-BACKPRESSURE"],
    ),
    503: (
        "ERR-JOB-503: the artefact store cannot be reached, or (a batch create) the "
        "database is unavailable or read-only; nothing changed, retry after Retry-After "
        "seconds.",
        ["ERR-JOB-503"],
    ),
}


def error_responses(*statuses: int) -> dict[int, OpenApiResponse]:
    return error_responses_from(ERRORS, *statuses)


_LIMITED = [200, 201, 429]
RATE_LIMIT_HEADERS = [
    response_header("RateLimit-Limit", "Submissions allowed per minute.", _LIMITED),
    response_header("RateLimit-Remaining", "Submissions left now.", _LIMITED),
    response_header(
        "RateLimit-Reset", "Seconds until the allowance is full again.", [200, 201, 429]
    ),
    response_header("Retry-After", "Seconds to wait before retrying.", [429]),
]
