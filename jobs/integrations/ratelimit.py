"""Atomic token buckets for job creation (docs/api.md#rate-limits).

Each bucket holds up to `limit` tokens and refills at `limit` per minute. One atomic
take (core/kv.py: a Lua script in Redis, locked rows in PostgreSQL with JOBOPS_REDIS
off) refills and takes from every bucket of a request (the caller's and the global
one) in a single step: two web processes can never both spend the last token,
as a read-then-write counter would let them. A request is refused when any bucket is
empty, and then takes from none; the refusal names the first empty one.

The organisation's bucket (docs/tenancy.md#limits) is taken with the caller's and the
global one, before the body is read, when the caller belongs to one organisation (the
create can go nowhere else): one call to the store, as before tenancy. A caller in several
organisations names one in the body, so its organisation's bucket is taken in a step of
its own once the create has resolved it.

Store unavailable: creation is NOT refused (fail open, logged). A rate limit protects
capacity; refusing every job because the limiter's store is down would turn a Redis
outage into an API outage, and the database still bounds the damage.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from django.conf import settings

from core.errors import ApplicationError
from core.kv import Bucket, KvUnavailable, kv_key, kv_store
from jobs.integrations import metrics

logger = logging.getLogger(__name__)

WINDOW_MS = 60_000


# Which allowance a refused create ran out of (the 429's details.limit).
LIMIT_NAMES = {"user": "yours", "org": "your organisation's", "global": "everyone's"}
# The rate_limited_total{scope} label of each (backpressure's is its own).
SCOPES = {"user": "user", "org": "organisation", "global": "global"}


class RateLimitExceededError(ApplicationError):
    code = "ERR-JOB-RATE-LIMIT"
    http_status = 429
    default_message = "Too many job submissions; retry after the time in Retry-After."

    def __init__(self, decision: RateDecision, *, limit: str, count: int = 1) -> None:
        details: dict[str, object] = {"retry_after": decision.retry_after, "limit": limit}
        message = (
            f"Too many job submissions: {LIMIT_NAMES[limit]} limit is reached; retry "
            "after the time in Retry-After."
        )
        if count > 1:
            # A batch: how many of its jobs the allowance holds now, so that a client
            # can send fewer, or wait for Retry-After (never: a batch above the limit
            # per minute itself, which it must split).
            details |= {"requested": count, "allowance": decision.available}
            details["capacity"] = decision.capacity
            if count > decision.capacity:
                message = (
                    f"The batch of {count} jobs is larger than {LIMIT_NAMES[limit]} limit "
                    f"of {decision.capacity} a minute; split it."
                )
            else:
                message = (
                    f"The batch of {count} jobs is larger than {LIMIT_NAMES[limit]} "
                    f"allowance now ({decision.available}); retry after the time in "
                    "Retry-After, or send fewer."
                )
        super().__init__(message, details=details)
        self.retry_after = decision.retry_after
        self.headers = decision.headers()


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    limit: int
    remaining: int
    reset: int  # seconds until the caller's bucket is full again
    retry_after: int  # seconds until a refused request would pass
    empty: int | None = None  # a refusal: the index of the first empty bucket
    available: int = 0  # a refusal: the whole tokens that bucket holds
    capacity: int = 0  # a refusal: that bucket's limit a minute

    def headers(self) -> dict[str, str]:
        return {
            "RateLimit-Limit": str(self.limit),
            "RateLimit-Remaining": str(self.remaining),
            "RateLimit-Reset": str(self.reset),
        }


def rate_limit_take(
    *, buckets: list[tuple[str, int]], costs: list[int] | None = None
) -> RateDecision | None:
    """Take one token (or `costs[i]` of bucket i) from every bucket `(key, limit per
    minute)` or from none.

    Returns the decision for the first bucket, or None when the store cannot answer
    (the caller lets the request through).
    """
    costs = costs or [1] * len(buckets)
    try:
        take = kv_store().take_tokens(
            [
                Bucket(kv_key("ratelimit", name), limit, limit / WINDOW_MS, cost)
                for (name, limit), cost in zip(buckets, costs, strict=True)
            ]
        )
    except KvUnavailable:
        logger.warning("rate limit not applied: its store is unavailable", exc_info=True)
        return None
    return RateDecision(
        allowed=take.allowed,
        limit=buckets[0][1],
        remaining=max(0, take.remaining),
        reset=math.ceil(take.full_ms / 1000),
        retry_after=max(1, math.ceil(take.wait_ms / 1000)) if not take.allowed else 0,
        empty=take.empty,
        available=take.available,
        capacity=buckets[take.empty][1] if take.empty is not None else 0,
    )


def job_create_rate_limit(*, user_id: object, org_id: int | None = None) -> RateDecision | None:
    """Count one job submission for `user_id` (docs/api.md#rate-limits: every POST counts),
    and with `org_id` for that organisation too, in one atomic take.

    Raises RateLimitExceededError when the caller's, the organisation's or the global
    bucket is empty (details.limit `user`, `org` or `global`: the first empty one).
    """
    limits = settings.JOBOPS_RATE_LIMITS
    buckets = [("user", f"create:user:{user_id}", int(limits["create_per_user"]))]
    if org_id is not None:
        buckets.append(("org", f"create:org:{org_id}", int(limits["create_per_org"])))
    buckets.append(("global", "create:global", int(limits["create_global"])))
    decision = rate_limit_take(buckets=[(key, limit) for _, key, limit in buckets])
    if decision is not None and not decision.allowed:
        raise _refused(decision, limit=buckets[decision.empty or 0][0])
    return decision


def job_create_org_rate_limit(*, org_id: int) -> RateDecision | None:
    """Count one job submission in organisation `org_id` (docs/tenancy.md#limits), for a
    caller in several organisations once the body has named one: all its members' and
    service accounts' creates share JOBOPS_RATE_LIMITS["create_per_org"] a minute, so
    one tenant cannot take the whole global allowance.

    Raises RateLimitExceededError (details.limit `org`) when the bucket is empty. Store
    down: None, allowed (as the other buckets)."""
    limit = int(settings.JOBOPS_RATE_LIMITS["create_per_org"])
    decision = rate_limit_take(buckets=[(f"create:org:{org_id}", limit)])
    if decision is not None and not decision.allowed:
        raise _refused(decision, limit="org")
    return decision


def job_batch_rate_limit(
    *, user_id: object, count: int, org_counts: dict[int, int]
) -> RateDecision | None:
    """Count a batch create of `count` jobs (docs/api.md#creating-jobs-in-a-batch): as
    many tokens from the caller's and the global bucket, and from each organisation's
    bucket its jobs' number (`org_counts`, organisation id: jobs), in one atomic take:
    all of them, or none.

    Raises RateLimitExceededError (details.limit the first bucket short, with the
    batch's size and the allowance it holds) when any bucket holds fewer. Store
    down: None, allowed (as a single create)."""
    limits = settings.JOBOPS_RATE_LIMITS
    named = [("user", f"create:user:{user_id}", int(limits["create_per_user"]), count)]
    named += [
        ("org", f"create:org:{org_id}", int(limits["create_per_org"]), jobs)
        for org_id, jobs in sorted(org_counts.items())
        if jobs
    ]
    named.append(("global", "create:global", int(limits["create_global"]), count))
    decision = rate_limit_take(
        buckets=[(key, limit) for _, key, limit, _ in named],
        costs=[cost for *_, cost in named],
    )
    if decision is not None and not decision.allowed:
        raise _refused(decision, limit=named[decision.empty or 0][0], count=count)
    return decision


def _refused(decision: RateDecision, *, limit: str, count: int = 1) -> RateLimitExceededError:
    """The refusal of a create whose `limit` bucket is empty, counted by its scope."""
    metrics.RATE_LIMITED.labels(scope=SCOPES[limit]).inc()
    return RateLimitExceededError(decision, limit=limit, count=count)
