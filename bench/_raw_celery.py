"""The baseline of bench/e2e.py: raw Celery no-op tasks, same broker and worker settings.

A quorum queue shaped like jobops' (`x-dead-letter-*`, delivery limit, max length),
acks late, reject on worker loss, failures not acked, publisher confirms, jobops'
hardened consumer, results ignored, no database. Each task stamps the time of its
first and last run and counts itself in Redis (keys under BENCH_RAW_KEY), so that
tasks/s = count / (first -> last), as jobops' figure is measured from its audit trail.

The worker runs `celery -A bench._raw_celery worker -Q bench_raw ...`.
"""

from __future__ import annotations

import os
import time
from functools import lru_cache
from typing import Any

from celery import Celery
from kombu import Exchange, Queue

QUEUE = "bench_raw"
KEY_ENV = "BENCH_RAW_KEY"

# Not the current app: in the benchmark process jobops publishes through Celery's
# current_app (jobs/publisher.py), which a second app would otherwise replace.
app = Celery("bench_raw", set_as_current=False)


def _config() -> dict[str, Any]:
    # The queue arguments of jobs/topology.py (docs/architecture.md), written out: importing the
    # app's topology module here would tie the baseline to its internals.
    queue = Queue(
        QUEUE,
        exchange=Exchange("bench.direct", type="direct", durable=True),
        routing_key=QUEUE,
        durable=True,
        queue_arguments={
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": f"{QUEUE}.dlx",
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
            "x-delivery-limit": 20,
            "x-max-length": 1_000_000,
        },
    )
    return {
        "broker_url": os.environ["BROKER_URL"],
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {"confirm_publish": True},
        "task_queues": [queue],
        "task_default_queue": QUEUE,
        "task_create_missing_queues": False,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": False,
        "task_ignore_result": True,
        "worker_consumer": "config.celery:JobopsConsumer",
        "worker_hijack_root_logger": False,
        "worker_send_task_events": False,
    }


app.add_defaults(_config)


@lru_cache(maxsize=1)
def _redis() -> Any:
    # One client per pool child (made after the fork), reused across tasks.
    import redis

    return redis.Redis.from_url(os.environ["REDIS_URL"])


@app.task(name="bench.noop")
def noop(i: int) -> None:
    key, now = os.environ[KEY_ENV], repr(time.time())
    with _redis().pipeline(transaction=False) as pipe:
        pipe.set(f"{key}:first", now, nx=True)
        pipe.set(f"{key}:last", now)
        pipe.incr(f"{key}:done")
        pipe.execute()


def publish(n: int) -> None:
    """Declare the queue, empty it and publish `n` tasks (with confirms)."""
    with app.connection_for_write() as conn:
        queue = app.conf.task_queues[0]
        queue(conn.default_channel).declare()
        queue(conn.default_channel).purge()
        with app.producer_or_acquire() as producer:
            for i in range(n):
                noop.apply_async(args=[i], producer=producer)
