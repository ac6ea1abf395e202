"""drf-spectacular for the jobs API: the schema view, and hooks saying what its request
bodies refuse."""

from __future__ import annotations

import threading
from typing import Any

from drf_spectacular.views import SpectacularAPIView
from rest_framework.request import Request
from rest_framework.response import Response

# drf-spectacular's generator keeps per-view state on shared objects while it walks the
# URLs, so two schemas generated at once in one process (a threaded web worker) can
# read each other's half-set state and answer 500 (drf-spectacular issues 1122, 1123,
# 1368). One at a time per process: the schema is read rarely and generated in well
# under a second.
_GENERATING = threading.Lock()


class SchemaApi(SpectacularAPIView):
    """GET /api/v1/schema/: the OpenAPI document, generated one request at a time."""

    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        with _GENERATING:
            return super().get(request, *args, **kwargs)


# Request bodies whose serializer refuses unknown fields (mass assignment): say so.
CLOSED_REQUEST_COMPONENTS = ("JobCreateInputRequest",)


# jobs.services.validate_idempotency_key, as a JSON Schema string.
IDEMPOTENCY_KEY_SCHEMA = {"pattern": "^[ -~]{1,255}$", "minLength": 1, "maxLength": 255}


def close_request_bodies(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Say in the schema what the API refuses: unknown fields in request bodies that
    refuse them, and idempotency keys outside 1-255 printable ASCII characters."""
    schemas = result.get("components", {}).get("schemas", {})
    for name in CLOSED_REQUEST_COMPONENTS:
        if name in schemas:
            schemas[name]["additionalProperties"] = False
    body_key = schemas.get("JobCreateInputRequest", {}).get("properties", {})
    if "idempotency_key" in body_key:
        body_key["idempotency_key"].update(IDEMPOTENCY_KEY_SCHEMA)
    for path in result.get("paths", {}).values():
        for operation in path.values():
            for parameter in operation.get("parameters", []) if isinstance(operation, dict) else []:
                if parameter.get("in") == "header" and parameter.get("name") == "Idempotency-Key":
                    parameter.setdefault("schema", {}).update(IDEMPOTENCY_KEY_SCHEMA)
    return result
