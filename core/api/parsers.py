"""The API's JSON parser: DRF's, plus the bounds of core.json (docs/api.md#creating-a-job).

DRF's JSONParser turns a `ValueError` into a 400 but lets `RecursionError` through, so a
body nested a few thousand levels deep answered 500; a few hundred levels parsed fine
and then crashed a worker that pickled it. Any body deeper than JOBOPS_MAX_JSON_DEPTH,
or holding what PostgreSQL's jsonb or JSON itself refuses (NUL, unpaired surrogates,
NaN/Infinity, integers past Python's digit limit), is a 400 here, before a view sees it.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from core.json import json_problem


class BoundedJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        limit = settings.JOBOPS_MAX_JSON_DEPTH
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise ParseError(f"The JSON body is nested deeper than {limit} levels.") from exc
        problem = json_problem(data, max_depth=limit)
        if problem:
            raise ParseError(f"The JSON body {problem}.")
        return data
