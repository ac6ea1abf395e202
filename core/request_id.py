"""X-Request-ID: accepted when sane, generated otherwise, returned, logged, stored on jobs."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse

from core.logging import bind_request_context, clear_request_context

HEADER = "X-Request-ID"
# A client's id lands in logs and in the jobs table: short, and no characters that
# could forge a log line or a header.
_SANE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def request_id_from(value: str | None) -> str:
    if value and _SANE.match(value):
        return value
    return uuid.uuid4().hex


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
        # Every log line of this request carries its id (structlog contextvars); the
        # context is cleared on both sides so that a worker thread never leaks it.
        clear_request_context()
        bind_request_context(request_id=request_id)
        try:
            response = self.get_response(request)
        finally:
            clear_request_context()
        response[HEADER] = request_id
        return response
