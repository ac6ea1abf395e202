"""Base views for the admin API calls (docs/api.md): who may call, how often, which codes.

Each API area subclasses `AdminApiView` and names its error prefix and error classes;
the permission classes and the throttle raise those, so one area's refusals all carry
its codes (`ERR-DLQ-401`, `ERR-DLQ-403`, `ERR-DLQ-429`, ...).
"""

from __future__ import annotations

from typing import Any

from core.api.permissions import HasRequiredPermissions, StaffWithVerifiedOtp
from core.api.throttles import ThrottledApiView
from core.errors import ApplicationError


class AdminNotVerifiedError(ApplicationError):
    code = "ERR-AUTH-401"
    http_status = 401
    default_message = "Admin calls need active staff with a verified one-time password."
    headers = {"WWW-Authenticate": 'Token realm="jobops admin"'}


class AdminForbiddenError(ApplicationError):
    code = "ERR-AUTH-403"
    http_status = 403
    default_message = "You lack the permission this call needs."


class AdminApiView(ThrottledApiView):
    """Staff with a verified OTP; `required_permissions` for writes; 30/min."""

    permission_classes = [StaffWithVerifiedOtp, HasRequiredPermissions]
    not_verified_error: Any = AdminNotVerifiedError
    forbidden_error: Any = AdminForbiddenError
    required_permissions: tuple[str, ...] = ()
