"""The one redis-py client for jobops' own keys (rate limits, queue depths).

Django's cache keeps its own connection for plain caching; this one exists for
Lua scripts and hashes. Timeouts are short: Redis only guards and caches here,
and a slow or dead Redis must not hold a request (callers fail open).
"""

from __future__ import annotations

from functools import lru_cache

import redis
from django.conf import settings

SOCKET_TIMEOUT = 0.25


@lru_cache(maxsize=4)
def _client_for(url: str) -> redis.Redis:
    return redis.Redis.from_url(
        url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT
    )


def redis_client() -> redis.Redis:
    # Keyed by URL so that a test overriding REDIS_URL gets its own pool.
    return _client_for(settings.REDIS_URL)


def redis_key(*parts: object) -> str:
    """A key under the deployment's prefix, so parallel runs on one Redis never collide."""
    return ":".join([settings.JOBOPS_REDIS_PREFIX, *(str(p) for p in parts)])
