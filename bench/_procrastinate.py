"""A peer of bench/executors.py: Procrastinate (PostgreSQL-only task queue), installed
by `make bench` only (the `bench` extra of pyproject.toml).

Its own schema (`procrastinate schema --apply`) in the benchmark's scratch database,
tables `procrastinate_*`; tasks on the queue `bench`, run by `procrastinate worker
--concurrency 2` processes (bench/executors.py starts two). The tasks are coroutines,
Procrastinate's own idiom and its fastest path (a sync task would run in a thread):
`noop` does nothing, `sleep10` awaits 10 ms. The figures come from its own trail,
`procrastinate_events` (`deferred`, `started`, `succeeded`, written by its triggers),
as jobops' come from the audit log. `defer_for` is the batch arm's context: how fast
Procrastinate itself creates jobs, one `defer` at a time or many in one `batch_defer`.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

from procrastinate import App, PsycopgConnector

QUEUE = "bench"
APP = "bench._procrastinate.app"

app = App(connector=PsycopgConnector(conninfo=os.environ.get("DATABASE_URL", "")))


@app.task(name="bench.noop", queue=QUEUE)
async def noop() -> None:
    return None


@app.task(name="bench.sleep10", queue=QUEUE)
async def sleep10() -> None:
    await asyncio.sleep(0.01)


TASKS: dict[str, Any] = {"noop": noop, "sleep10": sleep10}


def worker_argv(concurrency: int) -> list[str]:
    """The command line of one worker process."""
    return [
        *(sys.executable, "-m", "procrastinate", "--app", APP, "--log-level", "warning"),
        *("worker", "--queues", QUEUE, "--concurrency", str(concurrency)),
    ]


def schema_argv() -> list[str]:
    return [sys.executable, "-m", "procrastinate", "--app", APP, "schema", "--apply"]


def defer_many(kind: str, n: int, batch: int = 1000) -> list[int]:
    """`n` jobs deferred in batches (one statement each); their ids. The app must be
    open (`app.open()`)."""
    ids: list[int] = []
    for offset in range(0, n, batch):
        ids += TASKS[kind].batch_defer(*({} for _ in range(min(batch, n - offset))))
    return ids


def defer_one(kind: str) -> int:
    return int(TASKS[kind].defer())


def defer_for(
    kind: str, *, seconds: float, batch: int, concurrency: int, warmup: float = 1.0
) -> dict[str, float]:
    """`concurrency` coroutines deferring `kind` jobs back to back: each one job at a
    time (`defer_async`, batch 1) or `batch` jobs in one statement (`batch_defer_async`).

    1. Open the app (its async connector: a pool of 4 connections, as the API's 4
       gunicorn workers have one each);
    2. defer for `warmup` seconds (the pool's connections, prepared plans);
    3. defer for `seconds`, measured: {"jobs", "began", "ended"} (epoch seconds, for
       the caller's CpuSampler window);
    4. close the app.
    """
    return asyncio.run(
        _defer_for(kind, seconds=seconds, batch=batch, concurrency=concurrency, warmup=warmup)
    )


async def _defer_for(
    kind: str, *, seconds: float, batch: int, concurrency: int, warmup: float
) -> dict[str, float]:
    task = TASKS[kind]

    async def client(until: float) -> int:
        deferred = 0
        while time.monotonic() < until:
            if batch == 1:
                await task.defer_async()
                deferred += 1
            else:
                deferred += len(await task.batch_defer_async(*({} for _ in range(batch))))
        return deferred

    async def run(span: float) -> int:
        until = time.monotonic() + span
        return sum(await asyncio.gather(*(client(until) for _ in range(concurrency))))

    async with app.open_async():
        await run(warmup)
        began = time.time()
        jobs = await run(seconds)
        ended = time.time()
    return {"jobs": jobs, "began": began, "ended": ended}
