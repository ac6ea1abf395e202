"""How long appends wait while audit_detach detaches and drops a partition (issue 42,
point 2; docs/operations/audit-archives.md#detach).

In the database of DATABASE_URL (migrated; a scratch or dev database: it creates and
drops a partition of a past month, `audit_logs_job_2001_01`, and appends chains named
`bench-detach:*` to the current month's partition, which stay):

1. the partition is created standalone, filled with --rows rows (INSERT ... SELECT, no
   chain logic: only the lock matters here), then attached, as audit_create_partitions
   does;
2. a writer appends one entry every 10 ms on its own connection (the checkpoint barrier
   shared, a one-entry chain, its own transaction), timing each;
3. run A: `BEGIN; DETACH PARTITION; DROP TABLE; COMMIT` as audit_detach does (its own
   audit entry left out), timed; run B: the same while a reader holds audit_logs in an
   open transaction for 2 s (as a verification does for minutes): the detach waits for
   it, and every append queues behind the detach.

Prints the detach's time and the writer's longest append during it, for each run, and
writes bench/results/audit_detach.json.

Usage: python bench/audit_detach.py [--rows N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as common

NAME = "audit_detach"
TABLE = "audit_logs_job_2001_01"


def _create(url: str, rows: int) -> float:
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        conn.execute(
            f"CREATE TABLE {TABLE} (LIKE audit_logs INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        )
        conn.execute(
            f"ALTER TABLE {TABLE} ADD CONSTRAINT {TABLE}_part "
            "CHECK (part >= '2001-01-01' AND part < '2001-01-02')"
        )
        conn.execute(
            f"INSERT INTO {TABLE} (id, chain, job_id, seq, event_type, actor_type, actor_id, "
            "ts, payload, prev_hash, chain_hash, part) "
            "SELECT -g, 'job:' || md5((g / 10)::text)::uuid, md5((g / 10)::text)::uuid, "
            "g %% 10 + 1, 'x', 'system', 'bench', '2001-01-10', '{}', md5(g::text) || "
            "md5(g::text), md5((g + 1)::text) || md5(g::text), '2001-01-01' "
            "FROM generate_series(1, %s) g",
            [rows],
        )
        conn.execute(f"VACUUM ANALYZE {TABLE}")
        conn.execute(
            f"ALTER TABLE audit_logs ATTACH PARTITION {TABLE} "
            "FOR VALUES FROM ('2001-01-01') TO ('2001-01-02')"
        )
    return time.perf_counter() - started


class Writer(threading.Thread):
    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.times: list[tuple[float, float]] = []  # (start, seconds)

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.is_set():
                chain = f"bench-detach:{uuid.uuid4()}"
                started = time.perf_counter()
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock_shared(audit_barrier_key())")
                    conn.execute(
                        "INSERT INTO audit_logs (chain, seq, event_type, actor_type, actor_id, "
                        "ts, payload, prev_hash, chain_hash, part) VALUES (%s, 1, 'x', "
                        "'system', 'bench', now(), '{}', repeat('0', 64), "
                        "audit_chain_hash(repeat('0', 64), '{}'), audit_part_for_other(now()))",
                        [chain],
                    )
                self.times.append((started, time.perf_counter() - started))
                time.sleep(0.01)


def _detach(url: str, reader_seconds: float) -> dict[str, Any]:
    writer = Writer(url)
    writer.start()
    time.sleep(0.5)
    reader = None
    if reader_seconds:

        def hold() -> None:
            with psycopg.connect(url) as conn:
                conn.execute("SELECT count(*) FROM audit_logs WHERE part = '2001-01-01'")
                time.sleep(reader_seconds)
                conn.rollback()

        reader = threading.Thread(target=hold)
        reader.start()
        time.sleep(0.1)
    started = time.perf_counter()
    with psycopg.connect(url) as conn:
        conn.execute("SET lock_timeout = '5s'")
        conn.execute(f"ALTER TABLE audit_logs DETACH PARTITION {TABLE}")
        conn.execute(f"DROP TABLE {TABLE}")
        conn.commit()
    ended = time.perf_counter()
    if reader is not None:
        reader.join()
    time.sleep(0.3)
    writer.stop.set()
    writer.join()
    during = [s for t, s in writer.times if t + s >= started and t <= ended]
    before = [s for t, s in writer.times if t + s < started]
    return {
        "detach_seconds": round(ended - started, 4),
        "reader_seconds": reader_seconds,
        "appends_during": len(during),
        "longest_append_during_seconds": round(max(during, default=0.0), 4),
        "median_append_before_seconds": round(sorted(before)[len(before) // 2], 4)
        if before
        else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()
    url = os.environ["DATABASE_URL"]
    runs = {}
    for name, reader in (("plain", 0.0), ("behind_a_2s_reader", 2.0)):
        created = _create(url, args.rows)
        runs[name] = {
            "rows": args.rows,
            "create_seconds": round(created, 2),
            **_detach(url, reader),
        }
        print(
            f"{name}: {args.rows} rows, detach+drop {runs[name]['detach_seconds'] * 1000:.1f} ms; "
            f"{runs[name]['appends_during']} appends during it, the longest "
            f"{runs[name]['longest_append_during_seconds'] * 1000:.1f} ms (median before "
            f"{(runs[name]['median_append_before_seconds'] or 0) * 1000:.1f} ms)"
        )
    common.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = common.RESULTS_DIR / f"{NAME}.json"
    out.write_text(json.dumps(runs, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
