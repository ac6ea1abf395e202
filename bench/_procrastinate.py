"""A peer of bench/executors.py: Procrastinate (PostgreSQL-only task queue), installed
by `make bench` only (the `bench` extra of pyproject.toml).

Its own schema (`procrastinate schema --apply`) in the benchmark's scratch database,
tables `procrastinate_*`; tasks on the queue `bench`, run by `procrastinate worker
--concurrency 2` processes (bench/executors.py starts two). The tasks are coroutines,
Procrastinate's own idiom and its fastest path (a sync task would run in a thread):
`noop` does nothing, `sleep10` awaits 10 ms. The figures come from its own trail,
`procrastinate_events` (`deferred`, `started`, `succeeded`, written by its triggers),
as jobops' come from the audit log.
"""

from __future__ import annotations

import asyncio
import os
import sys
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
