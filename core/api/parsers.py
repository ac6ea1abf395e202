"""The API's JSON parser: DRF's, plus the bounds of core.json (docs/api.md#creating-a-job).

DRF's JSONParser turns a `ValueError` into a 400 but lets `RecursionError` through, so a
body nested a few thousand levels deep answered 500; a few hundred levels parsed fine
and then crashed a worker that pickled it. Any body deeper than JOBOPS_MAX_JSON_DEPTH,
or holding what PostgreSQL's jsonb or JSON itself refuses (NUL, unpaired surrogates,
NaN/Infinity, integers past Python's digit limit), is a 400 here, before a view sees it.

`json_body(request)` is how a view reads its body: DRF consults the parsers only when a
body arrives, so an empty body under `multipart/form-data` or
`application/x-www-form-urlencoded` came back as empty data, a 400 "field required"
instead of the 415 the README promises.
"""

from __future__ import annotations

import codecs
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError, UnsupportedMediaType
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.utils.json import strict_constant

from core.json import JSONRefusedError, json_read


class BoundedJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        """DRF's JSONParser.parse, reading through core.json.json_read (which DRF's
        own cannot be told to use)."""
        limit = settings.JOBOPS_MAX_JSON_DEPTH
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        options = {"parse_constant": strict_constant} if self.strict else {}
        try:
            text = codecs.getreader(encoding)(stream).read()
        except ValueError as exc:  # not in its charset
            raise ParseError(f"JSON parse error - {exc}") from exc
        try:
            return json_read(text, what="The JSON body", max_depth=limit, **options)
        except JSONRefusedError as exc:
            raise ParseError(str(exc)) from exc


def json_body(request: Request) -> Any:
    """The request's parsed body; 415 unless it is labelled with a media type the view
    parses (JSON). A request without a Content-Type and without a body reads as empty
    (`{}`), so that the fields it lacks are named; a body without a Content-Type is 415."""
    content_type = request.content_type
    if content_type or _has_body(request):
        if request.negotiator.select_parser(request, request.parsers) is None:
            raise UnsupportedMediaType(content_type)
    return request.data


def _has_body(request: Request) -> bool:
    meta = request.META
    try:
        length = int(meta.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    return length > 0 or "HTTP_TRANSFER_ENCODING" in meta
