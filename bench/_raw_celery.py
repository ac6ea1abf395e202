"""The baseline of bench/e2e.py: raw Celery no-op tasks, same broker and worker settings.

A quorum queue shaped like jobops' (`x-dead-letter-*`, delivery limit, max length),
acks late, reject on worker loss, failures not acked, publisher confirms, jobops'
hardened consumer, results ignored, no database. Each task stamps the time of its
first and last run and counts itself in Redis (keys under BENCH_RAW_KEY), so that
tasks/s = count / (first -> last), as jobops' figure is measured from its audit trail;
a `timed` task also stamps its own start (hash `<key>:start`, field = its number), for
submit -> start. `sleep10` is the same task with 10 ms of waiting (bench/executors.py).

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
# current_app (jobs/integrations/publisher.py), which a second app would otherwise replace.
app = Celery("bench_raw", set_as_current=False)


def celery_config(queue_name: str = QUEUE) -> dict[str, Any]:
    """The broker and worker settings of the baseline, for a queue of that shape
    (bench/_celery_results.py adds its result backend to the same)."""
    # The queue arguments of jobs/integrations/topology.py (docs/architecture.md), written
    # out: importing the app's topology module here would tie the baseline to its internals.
    queue = Queue(
        queue_name,
        exchange=Exchange("bench.direct", type="direct", durable=True),
        routing_key=queue_name,
        durable=True,
        queue_arguments={
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": f"{queue_name}.dlx",
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
        "task_default_queue": queue_name,
        "task_create_missing_queues": False,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": False,
        "task_ignore_result": True,
        "worker_consumer": "config.celery:JobopsConsumer",
        "worker_hijack_root_logger": False,
        "worker_send_task_events": False,
    }


app.add_defaults(celery_config)


@lru_cache(maxsize=1)
def _redis() -> Any:
    # One client per pool child (made after the fork), reused across tasks.
    import redis

    return redis.Redis.from_url(os.environ["REDIS_URL"])


def _stamp(i: int, started: float, timed: bool) -> None:
    key, now = os.environ[KEY_ENV], repr(time.time())
    with _redis().pipeline(transaction=False) as pipe:
        pipe.set(f"{key}:first", repr(started), nx=True)
        pipe.set(f"{key}:last", now)
        pipe.incr(f"{key}:done")
        if timed:
            pipe.hset(f"{key}:start", str(i), repr(started))
        pipe.execute()


@app.task(name="bench.noop")
def noop(i: int, timed: bool = False) -> None:
    _stamp(i, time.time(), timed)


@app.task(name="bench.sleep10")
def sleep10(i: int, timed: bool = False) -> None:
    started = time.time()
    time.sleep(0.01)
    _stamp(i, started, timed)


def declare_and_purge() -> None:
    with app.connection_for_write() as conn:
        queue = app.conf.task_queues[0]
        queue(conn.default_channel).declare()
        queue(conn.default_channel).purge()


def publish(n: int, task: Any = noop) -> None:
    """Declare the queue, empty it and publish `n` tasks (with confirms)."""
    declare_and_purge()
    with app.producer_or_acquire() as producer:
        for i in range(n):
            task.apply_async(args=[i], producer=producer)
