"""Refuse what no view should see: an oversized request line or header, a NUL in the
query string. Each is answered here, not raised: the JSON error envelope under /api/,
a plain page elsewhere (with DEBUG on Django would render its HTML debug page for /api/
too).

`RequestLimitsMiddleware`: gunicorn answered a 10 KB header or a 5,000-character
cursor with its own HTML 400/431 page. Its limits (config/gunicorn_conf.py) now sit
above these, so an oversized request reaches Django and is told in the envelope: 414
ERR-HTTP-414 for a URI longer than JOBOPS_MAX_URI_CHARS, 431 ERR-HTTP-431 for a header
line longer than JOBOPS_MAX_HEADER_BYTES or more than JOBOPS_MAX_HEADERS headers.
A body sent with `Transfer-Encoding` (chunked) is 411 ERR-HTTP-411: Django reads a body
by its Content-Length, so under gunicorn (which de-chunks it and sets
`wsgi.input_terminated`, which Django ignores) it was read as empty and a create was
answered as if nothing had been sent.

`RejectNulMiddleware`: PostgreSQL text cannot hold NUL, so `?status=%00` on an admin
list (whose filters are not form-validated) reached the database and answered 500.
Forms and serializers refuse NUL themselves; query strings are checked here, once, for
every page: a 400.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import SuspiciousOperation
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults

MESSAGE = "A query parameter holds a NUL character."
# WSGI keeps these two headers without the HTTP_ prefix.
_UNPREFIXED_HEADERS = {"CONTENT_TYPE": "Content-Type", "CONTENT_LENGTH": "Content-Length"}


class RequestLimitsMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        refusal = request_limits_refusal(request)
        if refusal is not None:
            return refusal
        return self.get_response(request)


def request_limits_refusal(request: HttpRequest) -> HttpResponse | None:
    """The 414, 431 or 411 answer for a request past the limits, or None."""
    uri_limit = settings.JOBOPS_MAX_URI_CHARS
    # gunicorn passes the request target as sent; elsewhere rebuild it.
    uri = request.META.get("RAW_URI") or request.get_full_path()
    if len(uri) > uri_limit:
        message = (
            f"The request URI is {len(uri)} characters long; at most {uri_limit} are accepted."
        )
        return _refuse(request, 414, message, {"limit": uri_limit, "size": len(uri)})
    # One pass over META, names built only for a refusal (every request runs this). WSGI
    # gives header values as latin-1 text, so a value's length is its length in bytes.
    count_limit = settings.JOBOPS_MAX_HEADERS
    size_limit = settings.JOBOPS_MAX_HEADER_BYTES
    count = 0
    too_long = None
    for key, value in request.META.items():
        if key.startswith("HTTP_"):
            size = len(key) - 3 + len(value)  # "Name: value": 5 prefix bytes out, 2 in
        elif key in _UNPREFIXED_HEADERS and value:
            size = len(_UNPREFIXED_HEADERS[key]) + 2 + len(str(value))
        else:
            continue
        count += 1
        if too_long is None and size > size_limit:
            too_long = (key, size)
    if count > count_limit:
        message = f"The request has {count} headers; at most {count_limit} are accepted."
        return _refuse(request, 431, message, {"limit": count_limit, "size": count})
    if too_long is not None:
        key, size = too_long
        name = _UNPREFIXED_HEADERS.get(key) or key[5:].replace("_", "-").title()
        message = f"The {name} header is {size} bytes long; at most {size_limit} are accepted."
        return _refuse(request, 431, message, {"header": name, "limit": size_limit, "size": size})
    if "HTTP_TRANSFER_ENCODING" in request.META:
        # Refused rather than read: Django's body reading, its upload limits and every
        # parser go by Content-Length; a proxy that buffers bodies (nginx does by
        # default) sends one, so only a client talking to gunicorn directly sees this.
        message = "A body sent with Transfer-Encoding is not read: send it with a Content-Length."
        encoding = request.META["HTTP_TRANSFER_ENCODING"][:100]
        return _refuse(request, 411, message, {"transfer_encoding": encoding})
    return None


def _refuse(
    request: HttpRequest, status: int, message: str, details: dict[str, Any]
) -> HttpResponse:
    if request.path.startswith("/api/"):
        body = {"error": {"code": f"ERR-HTTP-{status}", "message": message, "details": details}}
        return JsonResponse(body, status=status)
    return HttpResponse(message, status=status, content_type="text/plain; charset=utf-8")


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
