"""Scopes: what a token may do (docs/tenancy.md#scopes).

Each API view declares the scope its operations need, as a class attribute:
`required_scope = Scope.JOBS_READ` (every method) or a mapping by method
(`{"GET": Scope.JOBS_READ, "POST": Scope.JOBS_WRITE}`; HEAD counts as GET). A
request authenticated with an `ApiToken` needs that scope among the token's; a
session (the portal) or a legacy DRF token has every scope. A missing scope is
403 ERR-AUTH-403, naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from tenants.exceptions import ScopeMissingError
from tenants.models import ApiToken

# What a view declares: one scope for every method, or one per method.
RequiredScope = str | Mapping[str, str]


def required_scope_of(view: Any, method: str) -> str | None:
    """The scope `view` needs for `method`, or None (it needs none)."""
    declared = getattr(view, "required_scope", None)
    if isinstance(declared, Mapping):
        return declared.get("GET" if method == "HEAD" else method)
    return declared


def token_scopes(auth: Any) -> tuple[str, ...] | None:
    """The scopes of the token a request came with; None: every scope (a session, a
    legacy token)."""
    if isinstance(auth, ApiToken):
        return tuple(auth.scopes)
    return None


class HasRequiredScope(BasePermission):
    """The token holds the scope the view names for this method."""

    def has_permission(self, request: Request, view: Any) -> bool:
        needed = required_scope_of(view, request.method or "")
        if needed is None:
            return True
        needed = str(needed)  # the value, not the enum member's name
        scopes = token_scopes(request.auth)
        if scopes is not None and needed not in scopes:
            raise ScopeMissingError(
                f"This token lacks the scope {needed!r}.",
                details={"required_scope": str(needed), "token_scopes": list(scopes)},
            )
        return True
