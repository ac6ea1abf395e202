"""jobops' keys in Redis, for the tests and tools that look at them there.

jobops itself goes through core.kv (Redis or PostgreSQL, JOBOPS_REDIS); these names
are that module's Redis client and key maker.
"""

from __future__ import annotations

from core.kv import kv_key as redis_key
from core.kv import redis_client

__all__ = ["redis_client", "redis_key"]
