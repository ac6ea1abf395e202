"""Refuse a NUL in the query string before any view turns it into SQL.

PostgreSQL text cannot hold NUL, so `?status=%00` on an admin list (whose filters are
not form-validated) reached the database and answered 500. Forms and serializers refuse
NUL themselves; query strings are checked here, once, for every page. The answer is a
400: the JSON error envelope under /api/, Django's 400 page elsewhere (answered here,
not raised: with DEBUG on Django would render its HTML debug page for /api/ too).
"""

from __future__ import annotations

from collections.abc import Callable

from django.core.exceptions import SuspiciousOperation
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults

MESSAGE = "A query parameter holds a NUL character."


class RejectNulMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        for key, values in request.GET.lists():
            if "\x00" in key or any("\x00" in value for value in values):
                return _bad_request(request)
        return self.get_response(request)


def _bad_request(request: HttpRequest) -> HttpResponse:
    if request.path.startswith("/api/"):
        body = {"error": {"code": "ERR-HTTP-400", "message": MESSAGE, "details": {}}}
        return JsonResponse(body, status=400)
    return defaults.bad_request(request, SuspiciousOperation(MESSAGE))
