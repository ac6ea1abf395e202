"""The short-lived facts jobops shares between processes, in Redis or in PostgreSQL.

A handful of operations, each with a Redis and a PostgreSQL backend (JOBOPS_REDIS
picks one; docs/smallest-deployment.md):

- `get` / `set_many` (with a time-to-live) / `delete`: cached queue depths,
  OTP grants and the dashboard snapshot (through `KvCache`, Django's cache);
- `scan(prefix)`: every live entry under a prefix (process heartbeats);
- `take_tokens(buckets)`: the rate limiter's atomic take from several token buckets
  (each its own number of tokens: a batch create takes one per job).

Everything kept here can be lost: a lost bucket starts full, a lost heartbeat comes
back at the next beat, a lost grant is exchanged again. So the PostgreSQL backend is
an UNLOGGED table (`jobops_kv`, core/migrations/0001): no WAL, not on a standby,
emptied by a crash. Expired rows read as missing; the dispatcher's `kv_sweep` step
deletes them. Its statements are in core/queries.sql.

Errors of either store are raised as `KvUnavailable`; callers decide to fail open
(rate limits, backpressure) or to say so (OTP grants).
"""

from __future__ import annotations

import base64
import math
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

import redis
from django.conf import settings
from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache
from django.db import DatabaseError, connection, transaction

from core.queries import QUERIES

# Redis only guards and caches here: a slow or dead Redis must not hold a request.
REDIS_SOCKET_TIMEOUT = 0.25
# Rows the sweep deletes per run; a backlog goes in the next runs.
SWEEP_BATCH = 1000

# KEYS: one hash per bucket {t: tokens, ts: last refill ms}.
# ARGV: capacity, refill per ms, tokens to take, for each key in order.
# Returns {allowed, tokens left in bucket 1, ms until bucket 1 is full, ms to wait,
# the index (from 1) of the first bucket short of its tokens, 0 when none, the whole
# tokens that bucket holds}. A take larger than a bucket's capacity never passes: its
# wait is until the bucket is full.
TOKEN_BUCKET_LUA = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local tokens = {}
local allowed = 1
local wait = 0
local empty = 0
local available = 0
for i = 1, #KEYS do
  local cap = tonumber(ARGV[3 * i - 2])
  local rate = tonumber(ARGV[3 * i - 1])
  local cost = tonumber(ARGV[3 * i])
  local state = redis.call('HMGET', KEYS[i], 't', 'ts')
  local t = tonumber(state[1])
  local ts = tonumber(state[2])
  if t == nil or ts == nil then
    t = cap
    ts = now
  end
  t = math.min(cap, t + math.max(0, now - ts) * rate)
  tokens[i] = t
  if t < cost then
    if allowed == 1 then
      empty = i
      available = math.floor(t)
    end
    allowed = 0
    wait = math.max(wait, math.ceil((math.min(cost, cap) - t) / rate))
  end
end
for i = 1, #KEYS do
  local cap = tonumber(ARGV[3 * i - 2])
  local rate = tonumber(ARGV[3 * i - 1])
  if allowed == 1 then
    tokens[i] = tokens[i] - tonumber(ARGV[3 * i])
  end
  redis.call('HSET', KEYS[i], 't', tostring(tokens[i]), 'ts', now)
  redis.call('PEXPIRE', KEYS[i], math.ceil(cap / rate) + 1000)
end
local full = math.ceil((tonumber(ARGV[1]) - tokens[1]) / tonumber(ARGV[2]))
return {allowed, math.floor(tokens[1]), full, wait, empty, available}
"""


class KvUnavailable(Exception):
    """The store did not answer (Redis down or slow, the database unreachable)."""


@dataclass(frozen=True)
class Bucket:
    """A token bucket: `capacity` tokens, refilled at `per_ms` tokens a millisecond;
    a take takes `cost` tokens from it."""

    key: str
    capacity: float
    per_ms: float
    cost: int = 1


@dataclass(frozen=True)
class Take:
    """One take from several buckets: allowed (each bucket's cost from each) or not (from
    none)."""

    allowed: bool
    remaining: int  # tokens left in the first bucket
    full_ms: int  # until the first bucket is full again
    wait_ms: int  # until a refused take would pass
    empty: int | None  # a refusal: the index of the first bucket short of its cost
    available: int = 0  # a refusal: the whole tokens that bucket holds


class KvStore(Protocol):
    def get(self, key: str) -> str | None: ...
    def set_many(self, items: dict[str, str], *, ttl: float | None) -> None: ...
    def add(self, key: str, value: str, *, ttl: float | None) -> bool: ...
    def touch(self, key: str, *, ttl: float | None) -> bool: ...
    def delete(self, *keys: str) -> int: ...
    def clear(self) -> None: ...
    def scan(self, prefix: str) -> dict[str, str]: ...
    def take_tokens(self, buckets: list[Bucket]) -> Take: ...
    def sweep(self) -> int: ...


def kv_key(*parts: object) -> str:
    """A key under the deployment's prefix, so parallel runs on one store never collide."""
    return ":".join([settings.JOBOPS_REDIS_PREFIX, *(str(p) for p in parts)])


def kv_store() -> KvStore:
    """The configured store: Redis (JOBOPS_REDIS on) or PostgreSQL."""
    if settings.JOBOPS_REDIS:
        return RedisKv(redis_client())
    return PostgresKv()


def kv_sweep_once() -> int:
    """The dispatcher's step: delete expired entries (PostgreSQL; Redis expires its own)."""
    return kv_store().sweep()


def bucket_refill(
    states: list[tuple[float, int] | None], buckets: list[Bucket], now: int
) -> tuple[Take, list[float]]:
    """The token-bucket arithmetic of TOKEN_BUCKET_LUA, for the PostgreSQL backend:
    the take decided from each bucket's (tokens, stamp ms) at `now`, and the tokens
    each holds after it."""
    tokens: list[float] = []
    allowed, wait, empty, available = True, 0, None, 0
    for index, (state, bucket) in enumerate(zip(states, buckets, strict=True)):
        t, ts = state if state is not None else (bucket.capacity, now)
        t = min(bucket.capacity, t + max(0, now - ts) * bucket.per_ms)
        tokens.append(t)
        if t < bucket.cost:
            if allowed:
                empty, available = index, math.floor(t)
            allowed = False
            wait = max(wait, math.ceil((min(bucket.cost, bucket.capacity) - t) / bucket.per_ms))
    if allowed:
        tokens = [t - b.cost for t, b in zip(tokens, buckets, strict=True)]
    first = buckets[0]
    take = Take(
        allowed=allowed,
        remaining=math.floor(tokens[0]),
        full_ms=math.ceil((first.capacity - tokens[0]) / first.per_ms),
        wait_ms=wait,
        empty=empty,
        available=available,
    )
    return take, tokens


# --- Redis -------------------------------------------------------------------------


@lru_cache(maxsize=4)
def _redis_for(url: str) -> redis.Redis:
    return redis.Redis.from_url(
        url, socket_timeout=REDIS_SOCKET_TIMEOUT, socket_connect_timeout=REDIS_SOCKET_TIMEOUT
    )


def redis_client() -> redis.Redis:
    # Keyed by URL so that a test overriding REDIS_URL gets its own pool.
    return _redis_for(settings.REDIS_URL)


@contextmanager
def _redis_errors() -> Iterator[None]:
    try:
        yield
    except redis.RedisError as exc:
        raise KvUnavailable(f"Redis: {exc!r}") from exc


def _ms(ttl: float | None) -> int | None:
    return None if ttl is None else max(1, math.ceil(ttl * 1000))


class RedisKv:
    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def get(self, key: str) -> str | None:
        with _redis_errors():
            raw: Any = self.client.get(key)
        return raw.decode() if isinstance(raw, bytes) else raw

    def set_many(self, items: dict[str, str], *, ttl: float | None) -> None:
        with _redis_errors():
            pipe = self.client.pipeline(transaction=False)
            for key, value in items.items():
                pipe.set(key, value, px=_ms(ttl))
            pipe.execute()

    def add(self, key: str, value: str, *, ttl: float | None) -> bool:
        with _redis_errors():
            return bool(self.client.set(key, value, px=_ms(ttl), nx=True))

    def touch(self, key: str, *, ttl: float | None) -> bool:
        with _redis_errors():
            if ttl is None:
                return bool(self.client.persist(key)) or bool(self.client.exists(key))
            return bool(self.client.pexpire(key, _ms(ttl) or 1))

    def delete(self, *keys: str) -> int:
        with _redis_errors():
            return int(self.client.delete(*keys)) if keys else 0  # type: ignore[arg-type]

    def clear(self) -> None:
        with _redis_errors():
            self.client.flushdb()

    def scan(self, prefix: str) -> dict[str, str]:
        with _redis_errors():
            keys = list(self.client.scan_iter(match=f"{prefix}*", count=500))
            values: list[Any] = self.client.mget(keys) if keys else []  # type: ignore[assignment]
        # A key that expired between the scan and the read is left out.
        return {k.decode(): v.decode() for k, v in zip(keys, values, strict=True) if v is not None}

    def take_tokens(self, buckets: list[Bucket]) -> Take:
        args: list[float] = []
        for bucket in buckets:
            args += [bucket.capacity, bucket.per_ms, bucket.cost]
        with _redis_errors():
            # register_script is cheap (it hashes the text); EVALSHA falls back to EVAL once.
            script = self.client.register_script(TOKEN_BUCKET_LUA)
            allowed, remaining, full_ms, wait_ms, empty, available = script(
                keys=[b.key for b in buckets], args=args
            )
        return Take(
            allowed=bool(allowed),
            remaining=int(remaining),
            full_ms=int(full_ms),
            wait_ms=int(wait_ms),
            empty=int(empty) - 1 if not allowed else None,
            available=int(available),
        )

    def sweep(self) -> int:
        return 0  # Redis expires keys itself


# --- PostgreSQL --------------------------------------------------------------------


@contextmanager
def _database_errors() -> Iterator[None]:
    try:
        # A savepoint when the caller is in a transaction (a request's): a failed
        # statement here must not break the caller's own work.
        with transaction.atomic():
            yield
    except DatabaseError as exc:
        raise KvUnavailable(f"PostgreSQL: {exc!r}") from exc


class PostgresKv:
    def _run(self, name: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with _database_errors(), connection.cursor() as cursor:
            cursor.execute(QUERIES[name], params)
            return cursor.fetchall() if cursor.description else []

    def _rowcount(self, name: str, params: dict[str, Any]) -> int:
        with _database_errors(), connection.cursor() as cursor:
            cursor.execute(QUERIES[name], params)
            return cursor.rowcount

    def get(self, key: str) -> str | None:
        rows = self._run("kv_get", {"key": key})
        return rows[0][0] if rows else None

    def set_many(self, items: dict[str, str], *, ttl: float | None) -> None:
        if items:
            self._run(
                "kv_set_many",
                {
                    "keys": list(items),
                    "values": list(items.values()),
                    "ttl_ms": [_ms(ttl)] * len(items),
                },
            )

    def add(self, key: str, value: str, *, ttl: float | None) -> bool:
        return bool(self._run("kv_add", {"key": key, "value": value, "ttl_ms": _ms(ttl)}))

    def touch(self, key: str, *, ttl: float | None) -> bool:
        return bool(self._run("kv_touch", {"key": key, "ttl_ms": _ms(ttl)}))

    def delete(self, *keys: str) -> int:
        return self._rowcount("kv_delete", {"keys": list(keys)}) if keys else 0

    def clear(self) -> None:
        self._run("kv_clear", {})

    def scan(self, prefix: str) -> dict[str, str]:
        return dict(self._run("kv_scan", {"prefix": prefix}))  # type: ignore[arg-type]

    def take_tokens(self, buckets: list[Bucket]) -> Take:
        """1. Lock every bucket (inserted when new) and read its state and the database's
        clock; 2. decide as the Lua script does; 3. store every bucket's tokens with
        its time-to-live (long enough to refill), then commit: the locks make the
        whole take atomic."""
        keys = [b.key for b in buckets]
        with _database_errors(), connection.cursor() as cursor:
            cursor.execute(QUERIES["kv_buckets_lock"], {"keys": keys})
            found = {key: (value, now) for key, value, now in cursor.fetchall()}
            now = int(next(iter(found.values()))[1])
            states = [_bucket_state(found[key][0]) for key in keys]
            take, tokens = bucket_refill(states, buckets, now)
            cursor.execute(
                QUERIES["kv_set_many"],
                {
                    "keys": keys,
                    "values": [f"{t!r} {now}" for t in tokens],
                    "ttl_ms": [math.ceil(b.capacity / b.per_ms) + 1000 for b in buckets],
                },
            )
        return take

    def sweep(self) -> int:
        return self._rowcount("kv_sweep", {"limit": SWEEP_BATCH})


def _bucket_state(value: str | None) -> tuple[float, int] | None:
    if not value:
        return None
    tokens, stamp = value.split()
    return float(tokens), int(stamp)


# --- Django's cache on the store -------------------------------------------------------


class KvCache(BaseCache):
    """Django's cache API on the PostgreSQL store (CACHES with JOBOPS_REDIS off): the
    admin throttle's history, OTP grants and the dashboard snapshot go through it.
    Values are pickled, as every Django cache backend does."""

    def __init__(self, location: str, params: dict[str, Any]) -> None:
        super().__init__(params)
        self.store = PostgresKv()

    def _ttl(self, timeout: Any) -> float | None:
        # Seconds from now, None for "forever" (Django's timeout=None).
        if timeout is DEFAULT_TIMEOUT:
            timeout = self.default_timeout
        return None if timeout is None else float(timeout)

    @staticmethod
    def _dump(value: Any) -> str:
        return base64.b64encode(pickle.dumps(value, pickle.HIGHEST_PROTOCOL)).decode()

    def get(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        raw = self.store.get(self.make_and_validate_key(key, version=version))
        return default if raw is None else pickle.loads(base64.b64decode(raw))

    def set(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> None:
        ttl = self._ttl(timeout)
        full = self.make_and_validate_key(key, version=version)
        if ttl is not None and ttl <= 0:
            self.store.delete(full)
            return
        self.store.set_many({full: self._dump(value)}, ttl=ttl)

    def add(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> bool:
        full = self.make_and_validate_key(key, version=version)
        ttl = self._ttl(timeout)
        if ttl is not None and ttl <= 0:
            return False
        return self.store.add(full, self._dump(value), ttl=ttl)

    def touch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        full = self.make_and_validate_key(key, version=version)
        ttl = self._ttl(timeout)
        if ttl is not None and ttl <= 0:
            return bool(self.store.delete(full))
        return self.store.touch(full, ttl=ttl)

    def delete(self, key: Any, version: int | None = None) -> bool:
        return bool(self.store.delete(self.make_and_validate_key(key, version=version)))

    def clear(self) -> None:
        self.store.clear()
