"""drf-spectacular hooks every API area shares."""

from __future__ import annotations

from typing import Any


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
