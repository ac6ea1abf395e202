"""One exception handler for the whole API: every error leaves in one envelope.

`{"error": {"code", "message", "details"}}` (docs/api.md#errors). `ApplicationError`s carry
their own code and status; DRF's and Django's exceptions are mapped to a code here.
A database that is down, unreachable or read-only is a 503 with `Retry-After`
(nothing was written; a retry is safe). Anything else is not handled (returns None) so
that it stays a 500 and is logged, never swallowed.
"""

from __future__ import annotations

from typing import Any

from django import db
from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import set_rollback

from core.errors import ApplicationError

# Codes for DRF's own exceptions. 400 and 404 take the view's prefix (`ERR-JOB`,
# `ERR-DLQ`, ...) so that each API area keeps its codes; the others are HTTP-level.
_DRF_CODES: dict[type[exceptions.APIException], str] = {
    exceptions.NotAuthenticated: "ERR-AUTH-401",
    exceptions.AuthenticationFailed: "ERR-AUTH-401",
    exceptions.PermissionDenied: "ERR-AUTH-403",
    exceptions.MethodNotAllowed: "ERR-HTTP-405",
    exceptions.NotAcceptable: "ERR-HTTP-406",
    exceptions.UnsupportedMediaType: "ERR-HTTP-415",
    exceptions.Throttled: "ERR-RATE-LIMIT",
}
DEFAULT_PREFIX = "ERR-JOB"


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details or {}}}


def _message(detail: Any) -> str:
    if isinstance(detail, str):
        return detail
    return ""


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Render `exc` as the error envelope, or return None to let it be a 500.

    1. Django's Http404 / PermissionDenied become DRF's NotFound / PermissionDenied.
    2. ApplicationError: its own code, status, message and details; a `retry_after`
       attribute becomes the Retry-After header (rate limits, backpressure).
    3. DRF APIException: mapped to a code; validation errors keep their per-field
       details.
    4. The transaction of an ATOMIC_REQUESTS view is rolled back, as DRF's own does.
    """
    view = context.get("view")
    prefix = getattr(view, "error_prefix", DEFAULT_PREFIX)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()

    headers: dict[str, str] = {}
    if isinstance(exc, ApplicationError):
        body = error_body(exc.code, exc.message, exc.details)
        http_status = exc.http_status
        retry_after = getattr(exc, "retry_after", None)
        if retry_after is not None:
            headers["Retry-After"] = str(int(retry_after))
        headers.update(getattr(exc, "headers", None) or {})
    elif isinstance(exc, exceptions.APIException):
        http_status = exc.status_code
        if isinstance(exc, exceptions.ValidationError):
            body = error_body(f"{prefix}-400", "The request is invalid.", _details(exc.detail))
        elif isinstance(exc, exceptions.ParseError):
            body = error_body(f"{prefix}-400", f"Malformed request body: {exc.detail}")
        elif isinstance(exc, exceptions.NotFound):
            body = error_body(f"{prefix}-404", "Not found.")
        else:
            code = next(
                (c for cls, c in _DRF_CODES.items() if isinstance(exc, cls)),
                f"ERR-HTTP-{http_status}",
            )
            body = error_body(code, _message(exc.detail) or str(exc))
        if getattr(exc, "auth_header", None):
            headers["WWW-Authenticate"] = exc.auth_header  # type: ignore[attr-defined]
        if getattr(exc, "wait", None) is not None:
            headers["Retry-After"] = str(int(exc.wait))  # type: ignore[attr-defined]
    elif database_unavailable(exc):
        # Nothing was written (the transaction failed): the client may simply retry.
        http_status = status.HTTP_503_SERVICE_UNAVAILABLE
        body = error_body(
            f"{prefix}-503", "The database is unavailable or read-only; retry shortly."
        )
        headers["Retry-After"] = str(settings.JOBOPS_DB_RETRY_AFTER_SECONDS)
    else:
        return None
    set_rollback()
    return Response(body, status=http_status, headers=headers)


# SQLSTATE 25006: a write on a read-only server (a standby after failover, a database
# set read-only for maintenance).
_READ_ONLY_SQLSTATE = "25006"


def database_unavailable(exc: BaseException) -> bool:
    """The database cannot take this request now (down, unreachable, read-only)."""
    if isinstance(exc, db.OperationalError | db.InterfaceError):
        return True
    cause = exc.__cause__
    return isinstance(exc, db.DatabaseError) and getattr(cause, "sqlstate", None) == (
        _READ_ONLY_SQLSTATE
    )


def _details(detail: Any) -> Any:
    # A non-dict body ("Expected a dictionary") arrives as a list: key it like DRF does.
    if isinstance(detail, list):
        return {"non_field_errors": detail}
    return detail


def envelope_response(
    request: HttpRequest, code: str, message: str, status_code: int
) -> JsonResponse:
    return JsonResponse(error_body(code, message), status=status_code)


def api_not_found(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    """404 for any /api/ path that names no endpoint: JSON, never an HTML page."""
    return envelope_response(request, "ERR-JOB-404", "No such endpoint.", status.HTTP_404_NOT_FOUND)


def api_server_error(request: HttpRequest) -> JsonResponse:
    return envelope_response(
        request, "ERR-SERVER-500", "Internal server error.", status.HTTP_500_INTERNAL_SERVER_ERROR
    )


def api_handler400(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    # Django's own 400s (a disallowed Host, an oversized form) never reach DRF.
    if request.path.startswith("/api/"):
        return envelope_response(request, "ERR-HTTP-400", "Bad request.", 400)
    return defaults.bad_request(request, exception)  # type: ignore[arg-type]


def api_handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith("/api/"):
        return api_not_found(request)
    return defaults.page_not_found(request, exception)  # type: ignore[arg-type]


def api_handler500(request: HttpRequest) -> HttpResponse:
    if request.path.startswith("/api/"):
        return api_server_error(request)
    return defaults.server_error(request)


@csrf_exempt  # a POST to an unknown path is a 404, not a CSRF failure page
def api_not_found_view(request: HttpRequest, unmatched: str = "") -> JsonResponse:
    return api_not_found(request)
