"""X-Request-ID and X-Correlation-ID: accepted when sane, returned, logged, stored on
jobs and in their audit entries.

The request id names this one HTTP request (generated when absent or not sane); the
correlation id names the piece of work a client's requests belong to (its own id for
a business operation, across services), and defaults to the request id.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from django.http import HttpRequest, HttpResponse

from core.logging import bind_request_context, clear_request_context

HEADER = "X-Request-ID"
CORRELATION_HEADER = "X-Correlation-ID"
# A client's id lands in logs and in the jobs table: short, and no characters that
# could forge a log line or a header.
_SANE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


# The request being served on this thread or task: its audit entries name it.
_CURRENT_REQUEST_ID: ContextVar[str | None] = ContextVar("jobops_request_id", default=None)


def request_id_from(value: str | None) -> str:
    if value and _SANE.match(value):
        return value
    return uuid.uuid4().hex


def current_request_id() -> str | None:
    """The id of the HTTP request being served, or None (a worker, a command)."""
    return _CURRENT_REQUEST_ID.get()


def correlation_id_of(request: Any) -> str:
    """The request's correlation id: its sane X-Correlation-ID, else its request id."""
    value = getattr(request, "correlation_id", None)
    if value:
        return value
    header = request.headers.get(CORRELATION_HEADER)
    return header if header and _SANE.match(header) else request_id_of(request)


def request_id_of(request: Any) -> str:
    """The id RequestIdMiddleware gave this request (a Django or DRF request), or one
    made from its header when the middleware did not run (a request built in a test)."""
    return getattr(request, "request_id", None) or request_id_from(
        request.headers.get("X-Request-ID")
    )


class RequestIdMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request_id = request_id_from(request.META.get("HTTP_X_REQUEST_ID"))
        request.request_id = request_id  # type: ignore[attr-defined]
        # A correlation id that is not sane is replaced, as a request id is.
        header = request.META.get("HTTP_X_CORRELATION_ID")
        correlation_id = header if header and _SANE.match(header) else request_id
        request.correlation_id = correlation_id  # type: ignore[attr-defined]
        # Every log line of this request carries its ids (structlog contextvars); the
        # context is cleared on both sides so that a worker thread never leaks it.
        clear_request_context()
        bind_request_context(request_id=request_id, correlation_id=correlation_id)
        token = _CURRENT_REQUEST_ID.set(request_id)
        try:
            response = self.get_response(request)
        finally:
            _CURRENT_REQUEST_ID.reset(token)
            clear_request_context()
        response[HEADER] = request_id
        response[CORRELATION_HEADER] = correlation_id
        return response
