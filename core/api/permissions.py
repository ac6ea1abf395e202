"""Permission classes for admin API calls (docs/api.md): staff, a verified OTP, and the
operator's permissions for writes.

A refusal raises the view's own error class, so that each API area keeps its codes
(`ERR-DLQ-401`, `ERR-DLQ-403`, ...): `view.not_verified_error` when the caller is not
active staff with a verified OTP (anonymous callers included: one answer, 401, for
"who are you?"), `view.forbidden_error` when a verified caller lacks a permission.
"""

from __future__ import annotations

from typing import Any

from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from core.api.otp import otp_grant_for, token_digest


def otp_verified(request: Request) -> bool:
    """Whether this request carries a verified second factor.

    A session: the admin login verified an OTP device (django-otp's middleware marks
    the session's user). A token: it holds a live grant from `POST /api/v1/admin/otp`.
    """
    if isinstance(request.successful_authenticator, SessionAuthentication):
        is_verified = getattr(request.user, "is_verified", None)
        return bool(is_verified and is_verified())
    digest = token_digest(request.auth)
    if digest is not None:
        return otp_grant_for(token_digest=digest, user=request.user) is not None
    return False


def staff_powers(request: Request) -> bool:
    """Whether this request may use staff powers on the public API (every user's jobs,
    cancelling them, staff-only params): active staff with a verified second factor.

    A staff token without a live OTP grant is treated as its plain user, so a leaked
    staff token is worth no more than any other user's. Non-staff callers cost nothing
    here: the grant (a cache read) is looked up only for staff.
    """
    user = request.user
    if not (user and user.is_authenticated and user.is_active and user.is_staff):
        return False
    return otp_verified(request)


class StaffWithVerifiedOtp(BasePermission):
    """Active staff whose session or token passed a second factor."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if not staff_powers(request):
            raise view.not_verified_error()
        return True


class HasRequiredPermissions(BasePermission):
    """The view's `required_permissions` (e.g. the operator's `jobs.replay_deadletter`)
    for the methods in its `permission_methods` (by default the writes)."""

    def has_permission(self, request: Request, view: Any) -> bool:
        methods = getattr(view, "permission_methods", ("POST", "PUT", "PATCH", "DELETE"))
        needed = getattr(view, "required_permissions", ())
        if request.method in methods and needed and not request.user.has_perms(needed):
            raise view.forbidden_error()
        return True
