"""Base views for the admin API calls (DESIGN.md 6): who may call, how often, which codes.

Each API area subclasses `AdminApiView` and names its error prefix and error classes;
the permission classes and the throttle raise those, so one area's refusals all carry
its codes (`ERR-DLQ-401`, `ERR-DLQ-403`, `ERR-DLQ-429`, ...).
"""

from __future__ import annotations

import math
from typing import Any

from rest_framework.exceptions import MethodNotAllowed
from rest_framework.request import Request
from rest_framework.views import APIView

from core.api.permissions import HasRequiredPermissions, StaffWithVerifiedOtp
from core.api.throttles import AdminRateThrottle
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


class AdminRateLimitedError(ApplicationError):
    code = "ERR-RATE-LIMIT"
    http_status = 429
    default_message = "Too many admin calls; retry after Retry-After seconds."

    def __init__(self, *, retry_after: int) -> None:
        super().__init__(details={"retry_after": retry_after})
        self.retry_after = retry_after


class ThrottledApiView(APIView):
    """An API view that answers 405 before asking who calls, and throttles admin calls."""

    throttle_classes = [AdminRateThrottle]
    rate_limited_error: Any = AdminRateLimitedError

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        # DRF authenticates before it looks for the method's handler, so an unknown
        # method from an unverified caller would be a 401; the method not existing
        # is true whoever asks.
        method = (request.method or "").lower()
        if method not in self.http_method_names or not hasattr(self, method):
            raise MethodNotAllowed(request.method)
        super().initial(request, *args, **kwargs)

    def throttled(self, request: Request, wait: float | None) -> None:
        raise self.rate_limited_error(retry_after=max(1, math.ceil(wait or 1)))


class AdminApiView(ThrottledApiView):
    """Staff with a verified OTP; `required_permissions` for writes; 30/min."""

    permission_classes = [StaffWithVerifiedOtp, HasRequiredPermissions]
    not_verified_error: Any = AdminNotVerifiedError
    forbidden_error: Any = AdminForbiddenError
    required_permissions: tuple[str, ...] = ()
