"""DRF throttles every API area may use, and the base view of throttled admin calls."""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from rest_framework.exceptions import MethodNotAllowed
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle
from rest_framework.views import APIView

from core.errors import ApplicationError


class AdminRateThrottle(SimpleRateThrottle):
    """Admin API calls per user per minute: JOBOPS_RATE_LIMITS["admin_dlq"] (docs/api.md).

    DRF keeps each user's recent request times in the default cache (Redis, or the
    PostgreSQL key-value store of core/kv.py with JOBOPS_REDIS off), so the
    limit holds across web processes. Check and record are two cache calls, not one
    atomic step: two calls racing at the limit may both pass, which is acceptable for
    a 30/min guard on operator tools (job creation has the atomic token buckets instead).
    """

    scope = "admin_dlq"

    def get_rate(self) -> str:
        # Read at each request (DRF builds a throttle per request): settings overrides
        # in tests and JOBOPS_RATE_LIMITS changes apply at once.
        return f"{int(settings.JOBOPS_RATE_LIMITS['admin_dlq'])}/min"

    def get_cache_key(self, request: Request, view: Any) -> str:
        user = request.user
        ident = user.pk if user and user.is_authenticated else self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}


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
