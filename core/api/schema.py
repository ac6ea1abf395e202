"""drf-spectacular's schema view and the hooks every API area shares."""

from __future__ import annotations

import threading
from typing import Any

from drf_spectacular.utils import extend_schema
from drf_spectacular.views import SCHEMA_KWARGS, SpectacularAPIView
from rest_framework.request import Request
from rest_framework.response import Response

# drf-spectacular's generator keeps per-view state on shared objects while it walks the
# URLs (and loads its extensions on a process's first schema), so two schemas generated
# at once in one process (gunicorn's threads) read each other's half-set state and
# answer 500 (drf-spectacular issues 1122, 1123, 1368). One at a time per process: the
# schema is read rarely and generated in well under a second.
_GENERATING = threading.Lock()


class SchemaApi(SpectacularAPIView):
    """GET /api/v1/schema/: the OpenAPI document, generated one request at a time."""

    @extend_schema(**SCHEMA_KWARGS)
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        with _GENERATING:
            return super().get(request, *args, **kwargs)


def drop_slash_aliases(endpoints: list[tuple[Any, ...]], **kwargs: Any) -> list[tuple[Any, ...]]:
    """Document each path once: its slashed alias (`/api/v1/jobs/`) serves the same view.

    Also leaves out the catch-all that answers unknown /api/ paths with a JSON 404.
    """
    paths = {endpoint[0] for endpoint in endpoints}
    return [
        endpoint
        for endpoint in endpoints
        if not (endpoint[0].endswith("/") and endpoint[0].rstrip("/") in paths)
        and "{unmatched}" not in endpoint[0]
    ]


def close_request_bodies(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Mark the request bodies of `ClosedSerializer`s `additionalProperties: false`."""
    from core.api.serializers import CLOSED_REQUEST_COMPONENTS

    schemas = result.get("components", {}).get("schemas", {})
    for name in CLOSED_REQUEST_COMPONENTS & set(schemas):
        schemas[name]["additionalProperties"] = False
    return result


CORRELATION_ID = {
    "in": "header",
    "name": "X-Correlation-ID",
    # No pattern: a value outside it is replaced by the request id, not refused (as
    # X-Request-ID), so the schema must not promise a refusal.
    "schema": {"type": "string"},
    "description": (
        "Your id for the piece of work this request belongs to (1-128 of A-Z a-z 0-9 . _ : -; "
        "anything else is replaced); else the request id. Returned in the response, "
        "logged, and stored on a created job (its `correlation_id`) and in its audit "
        "entries."
    ),
}


def document_correlation_id(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Every operation that takes X-Request-ID takes X-Correlation-ID too (the same
    middleware reads both: core/request_id.py)."""
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            parameters = operation.get("parameters") if isinstance(operation, dict) else None
            if not parameters:
                continue
            names = {p.get("name") for p in parameters}
            if "X-Request-ID" in names and "X-Correlation-ID" not in names:
                parameters.append(dict(CORRELATION_ID))
    return result
