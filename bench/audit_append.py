"""Micro-benchmark: PostgreSQL's CPU to append a batch of audit entries (issue 38, point 3).

A batch of --batch entries (one per chain, each chain continuing its head, as a window
of job ends appends them) is appended in one statement, --rounds times, each round its
own transaction, by each of these variants, interleaved round by round:

- `per-row`: the start commit's shape, `CROSS JOIN LATERAL audit_append(...)` once per
  entry (its payload composed by the caller);
- `set`: `audit_append_entries(...)` once for the batch (payloads composed by the caller);
- `set+builder`: the same, each payload composed in the statement by
  `audit_entry_payload` from a jsonb of its data (the one builder of what is hashed);
- `builder`: `audit_entry_payload` of the batch alone, no insert;
- `set+jobs`: `audit_append_entries` with each payload composed as the job transitions
  compose it, `jobs_entry_payload` (concatenation for the keys it knows, the context from
  the job's columns), the chains being jobs' (`job:<id>`, the row a value);
- `jobs`: `jobs_entry_payload` of the batch alone, no insert.

Per variant: the CPU the serving backend spent per entry (utime + stime of its process,
read from /proc: the server must run on this machine) and the wall time per entry, as
medians over blocks of rounds. Variants whose functions the database lacks (a database
migrated by an older commit has no `audit_append_entries`: its insert trigger is the
row trigger of audit/migrations/0003) are skipped, so that running this script against
a database migrated by each commit compares them: `--database` names an existing
database; without it, the scratch database `jobops_bench_audit_append` is made with
`manage.py migrate` of this checkout and dropped at the end (--keep keeps it).

Usage: python bench/audit_append.py [--batch 100] [--rounds 300] [--database NAME] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as common

NAME = "audit_append"
GENESIS = "0" * 64
TS = "2026-11-29T12:00:00.000000Z"

PER_ROW = """
SELECT e.chain_hash
FROM unnest(%(chains)s::text[], %(seqs)s::bigint[], %(payloads)s::text[], %(prevs)s::text[])
     WITH ORDINALITY AS u(chain, seq, payload, prev, n)
CROSS JOIN LATERAL audit_append(u.chain, NULL, u.seq, 'succeeded', 'system', 'bench',
                                %(ts)s::timestamptz, u.payload, u.prev) AS e
ORDER BY u.n
"""
SET = """
SELECT chain_hash FROM audit_append_entries(
    %(chains)s::text[], array_fill(NULL::uuid, ARRAY[%(n)s]), %(seqs)s::bigint[],
    array_fill('succeeded'::text, ARRAY[%(n)s]), array_fill('system'::text, ARRAY[%(n)s]),
    array_fill('bench'::text, ARRAY[%(n)s]), array_fill(%(ts)s::timestamptz, ARRAY[%(n)s]),
    %(payloads)s::text[], %(prevs)s::text[])
"""
PAYLOADS = """
SELECT audit_entry_payload(u.chain, u.seq, %(ts_text)s, 'succeeded', 'system', 'bench', NULL,
                           u.data)
FROM unnest(%(chains)s::text[], %(seqs)s::bigint[], %(data)s::jsonb[]) WITH ORDINALITY
     AS u(chain, seq, data, n)
ORDER BY u.n
"""
SET_BUILDER = SET.replace("%(payloads)s::text[]", f"ARRAY({PAYLOADS})")
# The job's identity (the columns jobs_entry_payload takes), its data without the
# context, which jobs_entry_payload adds from them.
JOBS_PAYLOADS = """
SELECT jobs_entry_payload(
    substr(u.chain, 5)::uuid, u.seq, NULL, 'ai', 1, 1,
    u.data - 'context', 'succeeded', 'system', 'bench', %(ts_text)s,
    u.data #>> '{context,request_id}')
FROM unnest(%(chains)s::text[], %(seqs)s::bigint[], %(data)s::jsonb[]) WITH ORDINALITY
     AS u(chain, seq, data, n)
ORDER BY u.n
"""
# (The rows' job_id stays NULL, as in the other variants: no jobs rows exist here.)
SET_JOBS = SET.replace("%(payloads)s::text[]", f"ARRAY({JOBS_PAYLOADS})")
VARIANTS = {
    "per-row": PER_ROW,
    "set": SET,
    "set+builder": SET_BUILDER,
    "builder": PAYLOADS,
    "set+jobs": SET_JOBS,
    "jobs": JOBS_PAYLOADS,
}
NEEDS = {
    "per-row": "audit_append",
    "set": "audit_append_entries",
    "set+builder": "audit_entry_payload",
    "builder": "audit_entry_payload",
    "set+jobs": "jobs_entry_data",
    "jobs": "jobs_entry_data",
}
JOB_VARIANTS = ("set+jobs", "jobs")


def data_of(chain: str, seq: int) -> dict[str, Any]:
    """What a job's end entry carries (jobs' transitions: attempt, the change, context)."""
    return {
        "attempt": 1,
        "from": "running",
        "to": "succeeded",
        "context": {
            "correlation_id": None,
            "job_type": "ai",
            "org_id": 1,
            "project_id": 1,
            "request_id": f"req-{seq:08d}",
        },
    }


def payload_of(chain: str, seq: int) -> str:
    """The canonical payload as the caller composed it (audit.canonical); a job's chain
    names its job."""
    from audit.canonical import canonical_bytes, entry_payload

    value = entry_payload(
        chain=chain,
        seq=seq,
        ts=TS,
        event_type="succeeded",
        actor_type="system",
        actor_id="bench",
        job_id=chain[4:] if chain.startswith("job:") else None,
        data=data_of(chain, seq),
    )
    return canonical_bytes(value).decode("utf-8")


def cpu_seconds(pid: int) -> float:
    spent = common.process_cpu_seconds(pid)
    if spent is None:
        raise SystemExit(f"no /proc/{pid}: the database server must run on this machine")
    return spent


class Chains:
    """`batch` chains of one variant, each with its head (seq, hash)."""

    def __init__(self, variant: str, batch: int) -> None:
        tag = uuid.uuid4().hex[:8]
        self.names = [f"bench:{variant}:{tag}:{i}" for i in range(batch)]
        if variant in JOB_VARIANTS:
            self.names = [f"job:{uuid.uuid4()}" for _ in range(batch)]
        self.heads = [(0, GENESIS)] * batch

    def next_params(self) -> dict[str, Any]:
        """The next round's statement parameters; the heads move to the hashes it must
        return (audit.canonical.chain_hash), which the caller checks."""
        from audit.canonical import chain_hash

        seqs = [seq + 1 for seq, _ in self.heads]
        payloads = [payload_of(c, s) for c, s in zip(self.names, seqs, strict=True)]
        prevs = [prev for _, prev in self.heads]
        hashes = [chain_hash(p, b.encode()) for p, b in zip(prevs, payloads, strict=True)]
        self.heads = list(zip(seqs, hashes, strict=True))
        return {
            "n": len(self.names),
            "chains": self.names,
            "seqs": seqs,
            "prevs": prevs,
            "payloads": payloads,
            "data": [json.dumps(data_of(c, s)) for c, s in zip(self.names, seqs, strict=True)],
            "ts": TS,
            "ts_text": TS,
            "expected": hashes,
        }


def measure(url: str, batch: int, rounds: int, block: int) -> dict[str, Any]:
    with psycopg.connect(url) as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        present = {
            name
            for (name,) in conn.execute(
                "SELECT proname FROM pg_proc WHERE proname = ANY(%s)", [list(NEEDS.values())]
            )
        }
        conn.commit()
        variants = [v for v in VARIANTS if NEEDS[v] in present]
        chains = {v: Chains(v, batch) for v in variants}
        samples: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
        for start in range(0, rounds, block):
            for variant in variants:
                # Parameters first, outside the measured window: only the server's work counts.
                count = min(block, rounds - start)
                params = [chains[variant].next_params() for _ in range(count)]
                cpu, wall = cpu_seconds(pid), time.perf_counter()
                for p in params:
                    rows = conn.execute(VARIANTS[variant], p).fetchall()
                    conn.commit()
                    want = p["payloads"] if variant in ("builder", "jobs") else p["expected"]
                    if [r[0] for r in rows] != want:
                        raise SystemExit(f"{variant}: not what audit.canonical computes")
                entries = len(params) * batch
                samples[variant].append(
                    (
                        (cpu_seconds(pid) - cpu) / entries * 1e6,
                        (time.perf_counter() - wall) / entries * 1e6,
                    )
                )
    return {
        v: {
            "backend_cpu_us_per_entry": round(statistics.median(c for c, _ in s), 1),
            "wall_us_per_entry": round(statistics.median(w for _, w in s), 1),
            "blocks": len(s),
        }
        for v, s in samples.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--block", type=int, default=20, help="rounds per CPU sample")
    parser.add_argument("--database", help="an existing database (not dropped)")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    prefix = os.environ.get("BENCH_SCRATCH_PREFIX", "jobops_bench_")
    name = args.database or f"{prefix}{NAME}"
    url = common.server_database_url(name)
    admin = common.server_database_url("postgres")
    if not args.database:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        subprocess.run(
            [sys.executable, str(common.ROOT / "manage.py"), "migrate", "--noinput", "-v", "0"],
            cwd=common.ROOT,
            env={**os.environ, "DATABASE_URL": url},
            check=True,
        )
    try:
        import django

        django.setup()
        figures = measure(url, args.batch, args.rounds, args.block)
    finally:
        if not args.database and not args.keep:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(f"audit append, {args.batch} entries per statement, {args.rounds} rounds ({name}):")
    for variant, f in figures.items():
        print(
            f"  {variant:12} backend CPU {f['backend_cpu_us_per_entry']:7.1f} us/entry"
            f"   wall {f['wall_us_per_entry']:7.1f} us/entry"
        )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
