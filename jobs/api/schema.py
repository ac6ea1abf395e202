"""drf-spectacular hooks for the jobs API: what its request bodies refuse."""

from __future__ import annotations

from typing import Any

from jobs.services.batch_creation import MAX_INDEX_DIGITS

# Request bodies whose serializer refuses unknown fields (mass assignment): say so.
CLOSED_REQUEST_COMPONENTS = ("JobCreateInputRequest", "BatchCreateInputRequest")


# A batch's Idempotency-Key leaves room for `:<index>` in its items' 255 characters.
MAX_BATCH_REQUEST_KEY = 255 - 1 - MAX_INDEX_DIGITS


def idempotency_key_schema(longest: int = 255) -> dict[str, Any]:
    """jobs.services.validate_idempotency_key, as a JSON Schema string."""
    return {"pattern": f"^[ -~]{{1,{longest}}}$", "minLength": 1, "maxLength": longest}


def close_request_bodies(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Say in the schema what the API refuses: unknown fields in request bodies that
    refuse them, and idempotency keys outside 1-255 printable ASCII characters (1-248 for a
    batch's, which leaves room for `:<index>`)."""
    schemas = result.get("components", {}).get("schemas", {})
    for name in CLOSED_REQUEST_COMPONENTS:
        if name in schemas:
            schemas[name]["additionalProperties"] = False
    body_key = schemas.get("JobCreateInputRequest", {}).get("properties", {})
    if "idempotency_key" in body_key:
        body_key["idempotency_key"].update(idempotency_key_schema())
    for path in result.get("paths", {}).values():
        for operation in path.values():
            if not isinstance(operation, dict):
                continue
            batch = operation.get("operationId") == "jobs_batch_create"
            key = idempotency_key_schema(MAX_BATCH_REQUEST_KEY if batch else 255)
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "header" and parameter.get("name") == "Idempotency-Key":
                    parameter.setdefault("schema", {}).update(key)
    return result
