"""Queue-depth backpressure (docs/api.md#backpressure).

The dispatcher calls `queue_depths_refresh()` every few seconds: it reads each
primary queue's depth from RabbitMQ (a passive declare answers the message count
without creating or changing anything) and caches it in the key-value store
(core/kv.py: Redis, or PostgreSQL with JOBOPS_REDIS off) with a short TTL. Without a
broker (JOBOPS_BROKER off: every queue on the PostgreSQL executor) a queue's depth is
its jobs waiting for a worker, `pending` and `queued`, counted in the database.
The create view only reads that cache (no broker round trip per request; a read of
the store at most once a second per process, see DEPTH_MEMO_SECONDS) and refuses with
429 when the job's queue is deeper than its limit.

An unknown depth never refuses a job: no cache entry (dispatcher not running,
entry expired), the store down or the broker down all mean "accept". Backpressure
sheds load when we know the queue is long; it must not turn an outage of a
helper service into an outage of job submission.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from amqp.exceptions import AMQPError
from django.conf import settings
from django.db import connection
from kombu.exceptions import OperationalError

from core.broker import queue_depths as broker_queue_depths
from core.errors import ApplicationError
from core.kv import KvUnavailable, kv_key, kv_store
from jobs.domain.types import primary_queue_names
from jobs.integrations import metrics
from jobs.integrations.topology import dlq_name
from jobs.queries import QUERIES

logger = logging.getLogger(__name__)

# Per broker URL: (monotonic time, depths) of this process's last broker read.
_last_read: dict[str, tuple[float, dict[str, int]]] = {}
# How long a process answers a queue's depth from its own memory. The cache changes only
# every TTL/3 seconds (the dispatcher's refresh), so a store read per create bought no
# freshness and cost a second round trip per create beside the rate limiter's.
DEPTH_MEMO_SECONDS = 1.0
# Per (store, key): (monotonic time it expires, depth or None).
_memo: dict[tuple[str, str], tuple[float, int | None]] = {}


class BackpressureError(ApplicationError):
    code = "ERR-JOB-BACKPRESSURE"
    http_status = 429
    default_message = "The job's queue is too deep right now; retry after Retry-After."

    def __init__(self, *, queue: str, depth: int, limit: int, retry_after: int) -> None:
        super().__init__(details={"queue": queue, "depth": depth, "limit": limit})
        self.retry_after = retry_after


def _depth_key(queue: str) -> str:
    return kv_key("queue-depth", queue)


def queue_depths_read_broker() -> dict[str, int]:
    """Each primary queue's message count; a queue the broker lacks is left out.

    The dead-letter queues are read too (for the dlq_depth gauge); backpressure only
    looks at the primary ones. Raises kombu/amqp connection errors when the broker is
    down.
    """
    primaries = primary_queue_names()
    if not settings.JOBOPS_BROKER:
        return queue_depths_read_database()
    read = broker_queue_depths([*primaries, *(dlq_name(q) for q in primaries)])
    depths = {name: depth for name, depth in read.items() if depth is not None}
    # The same read feeds the queue_depth and dlq_depth gauges (docs/operations/observability.md).
    for name, depth in depths.items():
        gauge = metrics.QUEUE_DEPTH if name in primaries else metrics.DLQ_DEPTH
        gauge.labels(queue=name).set(depth)
    return {name: depth for name, depth in depths.items() if name in primaries}


def queue_depths_read_database() -> dict[str, int]:
    """Each primary queue's jobs waiting for a worker (`pending` and `queued`), for a
    deployment without a broker: what its queue holds is in the jobs table."""
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["queues_state"])
        counts = {queue: pending + queued for queue, pending, _age, queued in cursor.fetchall()}
    depths = {name: counts.get(name, 0) for name in primary_queue_names()}
    for name, depth in depths.items():
        metrics.QUEUE_DEPTH.labels(queue=name).set(depth)
    return depths


def queue_depths_step() -> dict[str, bool]:
    """The dispatcher's step (settings.JOBOPS_DISPATCHER_STEPS): refresh the cache.

    It reports whether it read the broker, not the depths: a depth is a level, not a
    count of work done, and a deep queue is no reason to run the step again at once
    (the loop reruns a step soon after it counted something; a flag counts nothing).
    """
    return {"broker_read": queue_depths_refresh_read()[0]}


def queue_depths_refresh(*, min_interval: float | None = None) -> dict[str, int]:
    """Read the depths from RabbitMQ and cache them in the store for the create view.

    The dispatcher calls this every loop (about once a second); a broker connection
    per second is churn RabbitMQ advises against, so a process reads the broker at
    most every `min_interval` seconds (default a third of the cache TTL, so the
    cache never lapses) and otherwise returns what it read last.
    Returns the depths read ({} when the broker is down; then the cache simply
    expires and creation falls back to accepting).
    """
    return queue_depths_refresh_read(min_interval=min_interval)[1]


def queue_depths_refresh_read(*, min_interval: float | None = None) -> tuple[bool, dict[str, int]]:
    """queue_depths_refresh, and whether it read the broker (False: from memory, or
    the broker is down)."""
    interval = settings.JOBOPS_QUEUE_DEPTH_TTL / 3 if min_interval is None else min_interval
    source = settings.BROKER_URL if settings.JOBOPS_BROKER else "database"
    last = _last_read.get(source)
    if last is not None and time.monotonic() - last[0] < interval:
        return False, last[1]
    try:
        depths = queue_depths_read_broker()
    except (OSError, OperationalError, AMQPError) as exc:
        logger.warning("queue depths not refreshed: broker unavailable (%s)", exc)
        return False, {}
    _last_read[source] = (time.monotonic(), depths)
    for name, depth in depths.items():
        _remember(_depth_key(name), depth)
    if depths:
        try:
            kv_store().set_many(
                {_depth_key(name): str(depth) for name, depth in depths.items()},
                ttl=settings.JOBOPS_QUEUE_DEPTH_TTL,
            )
        except KvUnavailable:
            logger.warning("queue depths not cached: store unavailable", exc_info=True)
    return True, depths


def queue_depth_cached(queue: str) -> int | None:
    """The cached depth of `queue`, or None when unknown (never cached, expired, store down).

    Read from the store at most every DEPTH_MEMO_SECONDS per process; a store that is
    down is also asked again only then, so creates do not each wait for its timeout.
    """
    key = _depth_key(queue)
    remembered = _memo.get((_store_name(), key))
    if remembered is not None and time.monotonic() < remembered[0]:
        return remembered[1]
    try:
        raw: Any = kv_store().get(key)
    except KvUnavailable:
        logger.warning("backpressure not applied: store unavailable", exc_info=True)
        return _remember(key, None)
    return _remember(key, int(raw) if raw is not None else None)


def _store_name() -> str:
    # A test (or a reconfigured process) pointing REDIS_URL elsewhere, or turning Redis
    # off, must not read what it remembered of the other store.
    return settings.REDIS_URL if settings.JOBOPS_REDIS else "postgres"


def _remember(key: str, depth: int | None) -> int | None:
    _memo[(_store_name(), key)] = (time.monotonic() + DEPTH_MEMO_SECONDS, depth)
    return depth


def queue_depths_forget() -> None:
    """Forget the depths this process remembers (tests that rewrite the cache)."""
    _memo.clear()


def backpressure_check(*, queue: str) -> None:
    """Raise BackpressureError when `queue` is known to be deeper than its limit."""
    limit = settings.JOBOPS_QUEUE_DEPTH_LIMITS.get(queue)
    if limit is None:
        return
    depth = queue_depth_cached(queue)
    if depth is not None and depth > limit:
        metrics.RATE_LIMITED.labels(scope="backpressure").inc()
        raise BackpressureError(
            queue=queue, depth=depth, limit=limit, retry_after=settings.JOBOPS_QUEUE_DEPTH_TTL
        )
