"""drf-spectacular hook: each operation names the token scope it needs
(docs/tenancy.md#scopes), from its view's `required_scope`."""

from __future__ import annotations

from typing import Any

from tenants.permissions import required_scope_of


def document_scopes(result: dict[str, Any], generator: Any, **kwargs: Any) -> dict[str, Any]:
    """`x-required-scope` on every scoped operation, and a line saying so in its
    description (what Swagger UI and ReDoc show)."""
    paths = result.get("paths", {})
    for path, _regex, method, callback in getattr(generator, "endpoints", None) or []:
        operation = paths.get(path, {}).get(method.lower())
        view = getattr(callback, "cls", None)
        scope = required_scope_of(view, method.upper()) if view is not None else None
        if operation is None or scope is None:
            continue
        operation["x-required-scope"] = str(scope)
        note = f"Token scope: `{scope}` (403 `ERR-AUTH-403` without it)."
        description = operation.get("description", "")
        operation["description"] = f"{description}\n\n{note}" if description else note
    return result
