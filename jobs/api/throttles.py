"""DRF throttle for job creation: the atomic token buckets of jobs/integrations/ratelimit.py."""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from jobs.integrations.ratelimit import job_create_rate_limit
from tenants.selectors import memberships_of


class JobCreateThrottle(BaseThrottle):
    """Every POST counts (docs/api.md#rate-limits), idempotent repeats and refusals included.

    A refusal raises RateLimitExceededError (429 ERR-JOB-RATE-LIMIT with Retry-After and
    the RateLimit-* headers); an allowed request leaves its decision on the request so
    that the view can send the RateLimit-* headers with its answer. Runs after
    authentication and before the body is parsed, so an oversized or malformed body
    counts too. Store down: allowed (jobs/integrations/ratelimit.py fails open).

    A caller in one organisation has its organisation's bucket taken in the same call
    (its job can go nowhere else); `request.rate_limit_org` says which organisation
    was counted, so that the create counts a caller in several only once it has named
    one (jobs.services.job_submit). Its memberships are cached on the user, so the
    create's own placement reads them again for nothing.
    """

    def allow_request(self, request: Request, view: Any) -> bool:
        if request.method != "POST":
            return True
        organisations = memberships_of(request.user)
        org_id = organisations[0].org_id if len(organisations) == 1 else None
        decision = job_create_rate_limit(user_id=request.user.pk, org_id=org_id)
        request.rate_limit_org = org_id  # type: ignore[attr-defined]
        request.rate_limit_headers = decision.headers() if decision else {}  # type: ignore[attr-defined]
        return True
