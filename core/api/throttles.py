"""DRF throttles every API area may use."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle


class AdminRateThrottle(SimpleRateThrottle):
    """Admin API calls per user per minute: JOBOPS_RATE_LIMITS["admin_dlq"] (DESIGN.md 6).

    DRF keeps each user's recent request times in the default cache (Redis), so the
    limit holds across web processes. Check and record are two cache calls, not one
    atomic step: two calls racing at the limit may both pass, which is acceptable for
    a 30/min guard on operator tools (job creation has the atomic Lua bucket instead).
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
