"""Profile: where one `POST /api/v1/jobs` spends its CPU (issue 39, point 4).

In one process, no gunicorn and no network between client and server: --creates
creates through Django's test client (the whole middleware stack, token auth, the
throttle, the view, the insert), each with a new idempotency key, on the scratch
database `jobops_bench_create_profile`, with rate limits out of the way and DEBUG off.
The dispatcher is not running: what a create leaves to it (publishing) is bench/api.py's.

1. Measured, without a profiler: Python CPU per create (this process, the test
   client's small share included), the serving PostgreSQL backend's CPU per create
   (utime + stime of its process, read from /proc: the server must run on this
   machine), statements per create and wall time.
2. Profiled, with cProfile timing CPU (time.process_time): the project's functions and
   the main library steps by cumulative CPU per create. A profiler inflates code of many
   small calls more than the rest, so read the shares, not the absolute figures, and
   take the absolute figures from step 1.

Writes bench/results/create_profile.json.

Usage: python bench/create_profile.py [--creates 1000] [--top 30] [--quick] [--keep]
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import resource
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as common
from bench._jobflow import bench_user, user_token

NAME = "create_profile"
FULL = {"creates": 1000}
QUICK = {"creates": 200}
WARM_UP = 50
BODY = {"type": "sim", "params": {"steps": 3}}
# Steps outside the project worth naming: the request's stages as Django and DRF run them.
STEPS = (
    "django/core/handlers/base.py:136(get_response)",
    "rest_framework/views.py:322(perform_authentication)",
    "rest_framework/views.py:358(check_throttles)",
    "rest_framework/serializers.py:217(is_valid)",
    "psycopg/cursor.py:80(execute)",
)


def _backend_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = common.parser_for(__doc__)
    parser.add_argument("--creates", type=int, help="creates measured and profiled [1000]")
    parser.add_argument("--top", type=int, default=30, help="project functions listed")
    args, report = common.prepare(NAME, parser, full=FULL, quick=QUICK)
    with common.Scratch(NAME, keep=args.keep) as scratch:
        scratch.setup_django()
        from django.db import connection
        from django.test import Client

        user = bench_user("bench-create-profile")
        client = Client(HTTP_HOST="localhost", HTTP_AUTHORIZATION=f"Token {user_token(user)}")
        statements = 0

        def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            nonlocal statements
            statements += 1
            return execute(sql, params, many, context)

        def create() -> None:
            body = json.dumps({**BODY, "idempotency_key": uuid.uuid4().hex})
            answer = client.post("/api/v1/jobs", data=body, content_type="application/json")
            if answer.status_code != 201:
                raise common.BenchError(f"create answered {answer.status_code}: {answer.content!r}")

        for _ in range(WARM_UP):
            create()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            backend = cursor.fetchone()[0]
        n = args.creates
        backend_before = _backend_cpu_seconds(backend)
        usage_before = resource.getrusage(resource.RUSAGE_SELF)
        began = time.perf_counter()
        with connection.execute_wrapper(count):
            for _ in range(n):
                create()
        wall = time.perf_counter() - began
        usage_after = resource.getrusage(resource.RUSAGE_SELF)
        backend_spent = _backend_cpu_seconds(backend) - backend_before
        python = (
            usage_after.ru_utime
            + usage_after.ru_stime
            - usage_before.ru_utime
            - usage_before.ru_stime
        )
        report.figure("python_cpu_ms_per_create", round(python * 1000 / n, 3), "ms", "Python CPU")
        report.figure(
            "postgres_cpu_ms_per_create",
            round(backend_spent * 1000 / n, 3),
            "ms",
            "PostgreSQL backend CPU",
        )
        report.figure("statements_per_create", round(statements / n, 2), "", "statements")
        report.figure("wall_ms_per_create", round(wall * 1000 / n, 3), "ms", "wall time")

        profile = cProfile.Profile(time.process_time)
        profile.enable()
        for _ in range(n):
            create()
        profile.disable()
        rows = _cumulative(pstats.Stats(profile), n)
        root = str(common.ROOT) + "/"
        steps = {name: ms for name, ms in rows.items() if name.endswith(STEPS)}
        own = {
            name.removeprefix(root): ms
            for name, ms in rows.items()
            if name.startswith(root) and "/.venv/" not in name and "/bench/" not in name
        }
        top = dict(sorted(own.items(), key=lambda kv: -kv[1])[: args.top])
        print("  profiled, cumulative CPU ms per create (inflated by the profiler):")
        for name, ms in sorted(steps.items(), key=lambda kv: -kv[1]):
            print(f"    {ms:7.3f}  {name.rsplit('site-packages/', 1)[-1]}")
        for name, ms in top.items():
            print(f"    {ms:7.3f}  {name}")
        report.extra("profile_steps_ms", steps)
        report.extra("profile_project_ms", top)
        report.write(scratch)
    return 1 if report.failed else 0


def _cumulative(stats: pstats.Stats, n: int) -> dict[str, float]:
    """Each function's cumulative CPU per create, keyed `path:line(name)`."""
    out: dict[str, float] = {}
    for (path, line, name), row in stats.stats.items():  # type: ignore[attr-defined]
        out[f"{path}:{line}({name})"] = round(row[3] * 1000 / n, 3)
    return out


if __name__ == "__main__":
    sys.exit(main())
