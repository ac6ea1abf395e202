"""The partitioned audit log's migration on a large table: each step's time, and whether
appends wait (issue 42, point 1; docs/operations/upgrading.md).

1. A scratch database `jobops_bench_audit_partition_migration` (BENCH_SCRATCH_PREFIX
   applies) migrated to the state before the partitioned log (audit 0009, jobs 0028),
   then jobs 0029 (the jobs column), as `manage.py migrate` would.
2. --rows valid audit entries (10 per job chain: bench/_chains.py) loaded with COPY,
   then VACUUM ANALYZE.
3. While a writer appends one entry every 100 ms (its own connection and chain, each
   entry its own transaction, through audit_append: the one-entry writer of
   audit/sql/append.sql, whose body the cut-over replaces), each database step of
   audit/migrations/0010_partitioned_audit_log.py runs in turn, timed; a writer's append
   whose time overlaps a step is that step's wait.

Prints one line per step (seconds, the writer's appends during it, their longest time)
and writes bench/results/audit_partition_migration.json. The default is 10 million rows
(--rows 2000000 for a shorter run; --quick: 200,000).

Usage: python bench/audit_partition_migration.py [--rows N] [--quick] [--keep]
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as common
from bench._chains import copy_chains

NAME = "audit_partition_migration"
FULL = {"rows": 10_000_000}
QUICK = {"rows": 200_000}
PER_JOB = 10
WRITER_EVERY = 0.1
APPEND = """
SELECT chain_hash FROM audit_append(%(chain)s, NULL, %(seq)s, 'bench', 'system', 'bench',
                                    now(), '{}', %(prev)s)
"""


def _database() -> tuple[str, str]:
    prefix = os.environ.get("BENCH_SCRATCH_PREFIX", "jobops_bench_")
    name = f"{prefix}{NAME}"
    return name, common.server_database_url(name)


def _manage(url: str, *args: str) -> None:
    env = {**os.environ, "DATABASE_URL": url, "DEBUG": "true"}
    subprocess.run(
        [sys.executable, "manage.py", *args, "-v0"], cwd=common.ROOT, env=env, check=True
    )


def _steps() -> list[tuple[str, str]]:
    """The migration's database steps, in order, as (name, SQL)."""
    m = importlib.import_module("audit.migrations.0010_partitioned_audit_log")
    steps = [("add part (constant default)", m.ADD_PART), ("add CHECK NOT VALID", m.ADD_CHECK)]
    steps.append(("VALIDATE CHECK", m.VALIDATE_CHECK))
    for name, columns in m.INDEXES:
        steps.append((f"unique index ({columns}) CONCURRENTLY", m.build(name, columns)))
    steps.append(("cut-over (rename, parent, attach, partitions)", m.CUT_OVER))
    steps.append(("audit_create_partitions() again", m.CREATE_PARTITIONS))
    steps.append(("drop the renamed append functions", m.DROP_RENAMED))
    return steps


class Writer(threading.Thread):
    """Appends one entry to its own chain every WRITER_EVERY seconds; records each
    append's (start, seconds) and any error."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stop = url, threading.Event()
        self.appends: list[tuple[float, float]] = []
        self.errors: list[str] = []

    def run(self) -> None:
        chain, seq, prev = f"bench:{uuid.uuid4()}", 0, "0" * 64
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.is_set():
                started = time.perf_counter()
                try:
                    with conn.transaction():
                        row = conn.execute(
                            APPEND, {"chain": chain, "seq": seq + 1, "prev": prev}
                        ).fetchone()
                    seq, prev = seq + 1, row[0]
                except psycopg.Error as exc:
                    self.errors.append(f"{type(exc).__name__}: {exc}".splitlines()[0])
                self.appends.append((started, time.perf_counter() - started))
                self.stop.wait(max(0.0, WRITER_EVERY - (time.perf_counter() - started)))


def main() -> None:
    parser = common.parser_for(__doc__)
    parser.add_argument("--rows", type=int, default=None, help="audit entries to load")
    args = common.resolve_sizes(parser.parse_args(), full=FULL, quick=QUICK)
    name, url = _database()
    admin = common.server_database_url("postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        run(args, url)
    finally:
        if not args.keep:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run(args: Any, url: str) -> None:
    _manage(url, "migrate", "audit", "0009_annotated")
    _manage(url, "migrate", "jobs", "0028_webhooks")
    _manage(url, "migrate", "jobs", "0029_job_audit_part")
    jobs = args.rows // PER_JOB
    started = time.perf_counter()
    with psycopg.connect(url) as conn:
        conn.execute("ALTER TABLE audit_logs DISABLE TRIGGER USER")
        copy_chains(conn, [str(uuid.uuid4()) for _ in range(jobs)], per_job=PER_JOB, by_chain=True)
        conn.execute("ALTER TABLE audit_logs ENABLE TRIGGER USER")
        conn.commit()
    load = time.perf_counter() - started
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE audit_logs")
        size = conn.execute("SELECT pg_total_relation_size('audit_logs')").fetchone()[0]
    print(f"loaded {jobs * PER_JOB:,} rows in {load:.1f} s ({size / 2**30:.2f} GiB with indexes)")

    writer = Writer(url)
    writer.start()
    time.sleep(1.0)  # a baseline of appends before the first step
    results = []
    with psycopg.connect(url, autocommit=True) as conn:
        for step, sql in _steps():
            t0 = time.perf_counter()
            conn.execute(sql)
            t1 = time.perf_counter()
            during = [s for start, s in writer.appends if start < t1 and start + s > t0]
            results.append(
                {
                    "step": step,
                    "seconds": round(t1 - t0, 3),
                    "appends": len(during),
                    "max_append_ms": round(max(during, default=0.0) * 1000, 1),
                }
            )
    time.sleep(1.0)
    writer.stop.set()
    writer.join()
    baseline = [s for start, s in writer.appends[:5]]
    with psycopg.connect(url, autocommit=True) as conn:
        partitions = conn.execute(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'audit_logs'::regclass"
        ).fetchone()[0]
        rows = conn.execute("SELECT count(*) FROM audit_logs").fetchone()[0]

    print(f"\n{'step':<52} {'seconds':>9} {'appends':>8} {'max append ms':>14}")
    for r in results:
        print(f"{r['step']:<52} {r['seconds']:>9.3f} {r['appends']:>8} {r['max_append_ms']:>14.1f}")
    total = sum(r["seconds"] for r in results)
    print(f"{'total':<52} {total:>9.3f}")
    print(
        f"writer: {len(writer.appends)} appends, errors {len(writer.errors)}, "
        f"baseline max {max(baseline, default=0) * 1000:.1f} ms; "
        f"{partitions} partitions, {rows:,} rows after"
    )
    for error in writer.errors[:5]:
        print("  writer error:", error)
    document = {
        "benchmark": NAME,
        "rows": args.rows,
        "load_seconds": round(load, 1),
        "table_bytes": size,
        "steps": results,
        "total_seconds": round(total, 3),
        "writer": {
            "appends": len(writer.appends),
            "errors": writer.errors,
            "every_seconds": WRITER_EVERY,
            "baseline_max_ms": round(max(baseline, default=0) * 1000, 1),
        },
        "machine": common.machine_facts(),
    }
    common.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = common.RESULTS_DIR / f"{NAME}.json"
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {out.relative_to(common.ROOT)}")


if __name__ == "__main__":
    main()
