"""Where a job's time goes: SQL statements and round trips per process, and cProfile.

Both hooks are installed by `bench/settings_bench.py` when their variable is set in a
process's environment, so the web, dispatcher and worker processes of a benchmark are
measured the same way and the app itself is untouched:

- `BENCH_TRACE_DIR`: every database connection Django opens gets libpq's protocol
  trace (`PQtrace`, exposed by psycopg as `pgconn.trace`) written to
  `<dir>/<BENCH_ROLE>.<pid>.<n>.trace`. The trace shows what the server really got,
  whatever the app uses (ORM, raw SQL, a CTE, psycopg pipeline mode), so:
  * a *statement* is a simple `Query` or an extended-protocol `Execute` other than
    transaction control (BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE);
  * a *round trip* is the client sending and then reading: every switch from
    frontend to backend messages. A pipeline of five statements is one round trip;
    five statements each awaited are five.
  libpq buffers its trace in a C `FILE*`, and pool children end with `os._exit`, so
  a thread calls `fflush(NULL)` twice a second: a reader waits a second before
  counting.
- `BENCH_CPROFILE=<path>`: a Celery worker (best with `-P solo`, so that the
  consumer and the tasks share the profiled main thread) runs under cProfile from
  `task_prerun` to `task_postrun` of each task and dumps its stats to `<path>` at
  `worker_shutdown`.
"""

from __future__ import annotations

import atexit
import ctypes
import itertools
import os
import pstats
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRACE_ENV = "BENCH_TRACE_DIR"
ROLE_ENV = "BENCH_ROLE"
CPROFILE_ENV = "BENCH_CPROFILE"

_counter = itertools.count(1)
_flusher_pid: int | None = None


# --- hooks (run inside the measured processes) ----------------------------------------
def install() -> None:
    """Called by bench/settings_bench.py; does nothing unless a variable asks for it."""
    if os.environ.get(TRACE_ENV):
        from django.db.backends.signals import connection_created

        connection_created.connect(_trace_connection, weak=False)
    if os.environ.get(CPROFILE_ENV):
        _profile_celery_worker(os.environ[CPROFILE_ENV])


def _trace_connection(sender: Any, connection: Any, **_: Any) -> None:
    import psycopg

    directory = Path(os.environ[TRACE_ENV])
    directory.mkdir(parents=True, exist_ok=True)
    role = os.environ.get(ROLE_ENV, "process")
    path = directory / f"{role}.{os.getpid()}.{next(_counter)}.trace"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    pgconn = connection.connection.pgconn
    pgconn.trace(fd)
    pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
    _start_flusher()


def _start_flusher() -> None:
    """One thread per process (a forked child starts its own) flushing C stdio."""
    global _flusher_pid
    if _flusher_pid == os.getpid():
        return
    _flusher_pid = os.getpid()
    libc = ctypes.CDLL(None)

    def flush() -> None:
        while True:
            time.sleep(0.5)
            libc.fflush(None)

    threading.Thread(target=flush, daemon=True, name="bench-trace-flush").start()
    atexit.register(libc.fflush, None)


def _profile_celery_worker(path: str) -> None:
    """Profile each task from task_prerun to task_postrun: the job's own path and the
    result it stores, not the consumer's idle wait for the next message (which would
    bury everything under epoll). Dumped at worker_shutdown."""
    import cProfile

    from celery.signals import task_postrun, task_prerun, worker_shutdown

    profiler = cProfile.Profile()

    @task_prerun.connect(weak=False)
    def _start(**_: Any) -> None:
        profiler.enable()

    @task_postrun.connect(weak=False)
    def _stop(**_: Any) -> None:
        profiler.disable()

    @worker_shutdown.connect(weak=False)
    def _dump(**_: Any) -> None:
        profiler.dump_stats(path)


# --- reading traces (in the benchmark process) -----------------------------------------
TX_CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE", "START TRANSACTION")
_PARSE = re.compile(r'^\s*"([^"]*)" "(.*)" \d+(?: \d+)*\s*$', re.S)
_BIND = re.compile(r'^\s*"[^"]*" "([^"]*)"')
_QUERY = re.compile(r'^\s*"(.*)"\s*$', re.S)
_STRING = re.compile(r"[EeBbXxUu]?'(?:[^']|'')*'")
_NUMBER = re.compile(r"(?<![\w$.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?\b")
_PLACEHOLDER = re.compile(r"\$\d+")
_LISTS = re.compile(r"\((?:\s*\?\s*(?:::[\w\[\]]+)?\s*,)+\s*\?\s*(?:::[\w\[\]]+)?\s*\)")


def sql_shape(sql: str) -> str:
    """The statement with its values taken out, so that equal statements count together."""
    shape = _STRING.sub("?", sql)
    shape = _PLACEHOLDER.sub("?", shape)
    shape = _NUMBER.sub("?", shape)
    shape = _LISTS.sub("(...)", shape)
    return " ".join(shape.split()).replace('"', "")


@dataclass
class TraceCounts:
    """Totals over the trace files of one role (web, dispatcher, worker, ...)."""

    statements: int = 0
    round_trips: int = 0
    transactions: int = 0
    shapes: Counter[str] = field(default_factory=Counter)

    def add(self, other: TraceCounts) -> None:
        self.statements += other.statements
        self.round_trips += other.round_trips
        self.transactions += other.transactions
        self.shapes.update(other.shapes)

    def minus(self, earlier: TraceCounts) -> TraceCounts:
        return TraceCounts(
            statements=self.statements - earlier.statements,
            round_trips=self.round_trips - earlier.round_trips,
            transactions=self.transactions - earlier.transactions,
            shapes=self.shapes - earlier.shapes,
        )


def _messages(path: Path) -> list[tuple[str, str, str]]:
    """(direction F|B, message type, rest) per message; SQL may span lines."""
    messages: list[tuple[str, str, str]] = []
    with path.open(errors="replace") as file:
        for line in file:
            if line[:2] in ("F\t", "B\t"):
                parts = line.rstrip("\n").split("\t", 3)
                if len(parts) >= 3:
                    messages.append((parts[0], parts[2], parts[3] if len(parts) > 3 else ""))
                    continue
            if messages:  # a continuation line of the previous message's text
                direction, kind, rest = messages[-1]
                messages[-1] = (direction, kind, rest + "\n" + line.rstrip("\n"))
    return messages


def count_trace(path: Path) -> TraceCounts:
    counts = TraceCounts()
    prepared: dict[str, str] = {}
    bound = ""
    previous = ""
    for direction, kind, rest in _messages(path):
        if direction == "B" and previous == "F":
            counts.round_trips += 1
        previous = direction
        if direction != "F":
            continue
        sql: str | None = None
        if kind == "Query":
            match = _QUERY.match(rest)
            sql = match.group(1) if match else rest
        elif kind == "Parse":
            match = _PARSE.match(rest)
            if match:
                prepared[match.group(1)] = match.group(2)
        elif kind == "Bind":
            match = _BIND.match(rest)
            bound = prepared.get(match.group(1), "") if match else ""
        elif kind == "Execute":
            sql = bound
        if sql is None:
            continue
        head = sql.lstrip().upper()
        if head.startswith(TX_CONTROL):
            if head.startswith(("BEGIN", "START TRANSACTION")):
                counts.transactions += 1
            continue
        counts.statements += 1
        counts.shapes[sql_shape(sql)[:140]] += 1
    return counts


def per_job(
    *,
    phase: TraceCounts,
    idle: TraceCounts,
    jobs: int,
    idle_scale: float,
) -> dict[str, Any]:
    """Counts of one process per job, its idle activity taken off.

    A process that works while idle (the dispatcher's polling loop) is charged only
    for what it did beyond its idle rate: `idle_scale` is the job phase's length over
    the idle window's.
    """

    def net(value: int, idle_value: int) -> float:
        return round((value - idle_value * idle_scale) / jobs, 2)

    shapes = [(net(n, idle.shapes.get(shape, 0)), shape) for shape, n in phase.shapes.most_common()]
    return {
        "statements": net(phase.statements, idle.statements),
        "round_trips": net(phase.round_trips, idle.round_trips),
        "transactions": net(phase.transactions, idle.transactions),
        "top_statements": sorted((s for s in shapes if s[0] >= 0.01), reverse=True)[:10],
    }


def read_traces(directory: Path) -> dict[str, TraceCounts]:
    """{role: counts} over every trace file in `directory` so far."""
    roles: dict[str, TraceCounts] = {}
    for path in sorted(directory.glob("*.trace")):
        role = path.name.split(".", 1)[0]
        roles.setdefault(role, TraceCounts()).add(count_trace(path))
    return roles


# --- reading cProfile stats -------------------------------------------------------------
_GROUPS = [
    ("jobops app", ("/jobs/", "/audit/", "/dlq/", "/core/", "/config/")),
    ("django", ("/django/",)),
    ("psycopg", ("/psycopg",)),
    ("kombu/amqp/vine", ("/kombu/", "/amqp/", "/vine/")),
    ("celery/billiard", ("/celery/", "/billiard/")),
    ("structlog/logging", ("/structlog/", "/logging/")),
    ("json/rfc8785", ("/json/", "rfc8785")),
    ("prometheus/otel", ("/prometheus_client/", "/opentelemetry")),
]


def _group(filename: str, function: str) -> str:
    if "psycopg" in filename and function in ("wait", "wait_c", "wait_epoll", "wait_select"):
        return "waiting on PostgreSQL (psycopg wait)"
    if filename == "~":  # a built-in: socket waits show up here
        if any(w in function for w in ("poll", "select", "recv", "send", "wait", "sleep")):
            return "socket/IO waits (built-in)"
        return "other built-ins"
    for name, needles in _GROUPS:
        if any(n in filename for n in needles):
            return name
    return "other Python"


def profile_summary(path: Path, *, top: int = 15) -> dict[str, Any]:
    """Top functions by own time, and own time grouped by package."""
    stats = pstats.Stats(str(path))
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values()) or 1e-9
    groups: Counter[str] = Counter()
    rows = []
    for (filename, line, function), (_cc, calls, tottime, cumtime, _callers) in raw.items():
        groups[_group(filename, function)] += tottime
        rows.append((tottime, cumtime, calls, f"{_short(filename)}:{line}({function})"))
    rows.sort(reverse=True)
    return {
        "total_seconds": round(total, 3),
        "by_group": {k: round(v, 3) for k, v in groups.most_common()},
        "top": [
            {"own_s": round(t, 3), "cum_s": round(c, 3), "calls": n, "function": f}
            for t, c, n, f in rows[:top]
        ],
    }


def _short(filename: str) -> str:
    for marker in ("site-packages/", "/work/", "/lib/python3"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename
