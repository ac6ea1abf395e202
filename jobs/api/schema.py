"""drf-spectacular hooks for the jobs API: what its request bodies refuse."""

from __future__ import annotations

from typing import Any

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
