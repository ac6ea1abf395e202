"""Job handlers the benchmarks plug in with JOBOPS_HANDLERS (docs/architecture.md).

They do no work of their own, so that a benchmark measures jobops' cost per job.
"""

from __future__ import annotations

import os
import time
from typing import Any

RUNS_KEY_ENV = "BENCH_RUNS_KEY"


def noop(ctx: Any, params: dict[str, Any]) -> None:
    """Nothing: the cost of a job is then all jobops'."""
    return None


def count_run(ctx: Any, params: dict[str, Any]) -> None:
    """Count each execution in Redis (hash BENCH_RUNS_KEY, field = job id): the
    benchmark then checks that every accepted job ran exactly once."""
    import redis

    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    client.hincrby(os.environ[RUNS_KEY_ENV], str(ctx.job_id), 1)
    client.close()


def sleep_10ms(ctx: Any, params: dict[str, Any]) -> None:
    """10 ms of waiting and no CPU: the `10 ms jobs` of bench/executors.py."""
    time.sleep(0.01)
