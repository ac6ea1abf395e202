"""Refuse a NUL in the query string before any view turns it into SQL.

PostgreSQL text cannot hold NUL, so `?status=%00` on an admin list (whose filters are
not form-validated) reached the database and answered 500. Forms and serializers refuse
NUL themselves; query strings are checked here, once, for every page. The 400 goes
through Django's handler400: the JSON envelope under /api/, the HTML page elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable

from django.core.exceptions import SuspiciousOperation
from django.http import HttpRequest, HttpResponse


class NulInQueryString(SuspiciousOperation):
    pass


class RejectNulMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        for key, values in request.GET.lists():
            if "\x00" in key or any("\x00" in value for value in values):
                raise NulInQueryString(f"NUL character in query parameter {key!r}")
        return self.get_response(request)
