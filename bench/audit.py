"""Benchmark: `verify_audit_chain` over 1,000,000 rows vs a bare chain walk (docs/benchmarks.md).

Scratch database `jobops_bench_audit`:

1. Load --rows valid audit rows over --jobs job chains with COPY (bench/_chains.py,
   checked first against a payload the app writes), round by round so that a chain's
   rows are spread over the table as in production. The audit triggers are disabled
   for the load only (as the table owner, in the scratch database) and re-enabled.
2. Write one checkpoint (`manage.py audit_checkpoint`).
3. In a fresh process, time `manage.py verify_audit_chain --json` (the command,
   in-process through call_command) and read its peak RSS (VmHWM).
4. Baseline, in a fresh process without Django: stream the same rows in (chain, seq)
   order with a server-side cursor and recompute every hash and link in Python: the
   floor of any verifier in this language on this machine.
Target (issue 10): >= 150,000 rows/s in < 100 MB. Writes bench/results/audit.json.

Usage: python bench/audit.py [--rows 1000000] [--jobs 100000] [--quick] [--keep]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as common
from bench._chains import check_payload_form, copy_chains

NAME = "audit"
# Sizes of `make bench`, and of --quick (seconds, for development).
FULL = {"rows": 1_000_000, "jobs": 100_000}
QUICK = {"rows": 50_000, "jobs": 5_000}


def load(scratch: common.Scratch, *, rows: int, jobs: int) -> float:
    """COPY the chains with the audit triggers off for the load only; the seconds."""
    job_ids = [str(uuid.uuid4()) for _ in range(jobs)]
    with common.stopwatch() as timing:
        with scratch.connect(autocommit=False) as conn:
            conn.execute("ALTER TABLE audit_logs DISABLE TRIGGER USER")
            copy_chains(conn, job_ids, per_job=rows // jobs, by_chain=False)
            conn.execute("ALTER TABLE audit_logs ENABLE TRIGGER USER")
            conn.commit()
        with scratch.connect() as conn:
            conn.execute("VACUUM ANALYZE audit_logs")
    return timing["seconds"]


def child(kind: str) -> None:
    """Runs in a fresh process; prints one JSON line (seconds, rows, peak RSS)."""
    if kind == "verify":
        import django

        django.setup()
        from django.core.management import call_command

        rss_setup = common.peak_rss_kb()
        out = io.StringIO()
        started = time.perf_counter()
        try:
            call_command("verify_audit_chain", "--json", stdout=out)
            code = 0
        except SystemExit as exc:  # exit 1: tampered; the JSON says what
            code = int(exc.code or 0)
        seconds = time.perf_counter() - started
        document = json.loads(out.getvalue())
        rows = int(document.get("rows_checked", 0))
        result = {"exit": code, "ok": document.get("ok"), "problems": document.get("problems")}
    else:
        import psycopg

        rss_setup = common.peak_rss_kb()
        started = time.perf_counter()
        rows, broken = walk(psycopg.connect(os.environ["DATABASE_URL"]))
        seconds = time.perf_counter() - started
        result = {"exit": 0 if not broken else 1, "ok": not broken, "problems": broken}
    print(
        json.dumps(
            {
                **result,
                "rows": rows,
                "seconds": seconds,
                "rss_after_setup_kb": rss_setup,
                "peak_rss_kb": common.peak_rss_kb(),
            },
            default=str,
        )
    )


def walk(conn: Any) -> tuple[int, int]:
    """Every row's hash and link, in chain order: (rows, broken rows)."""
    import hashlib

    rows = broken = 0
    chain, head = None, "0" * 64
    with conn.transaction(), conn.cursor(name="walk") as cursor:
        cursor.itersize = 10_000
        cursor.execute(
            "SELECT chain, payload, prev_hash, chain_hash FROM audit_logs ORDER BY chain, seq"
        )
        for row_chain, payload, prev, digest in cursor:
            if row_chain != chain:
                chain, head = row_chain, "0" * 64
            computed = hashlib.sha256(bytes.fromhex(prev) + payload.encode()).hexdigest()
            if prev != head or computed != digest:
                broken += 1
            head = digest
            rows += 1
    return rows, broken


def run_child(scratch: common.Scratch, kind: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", kind],
        env=scratch.env(),
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise common.BenchError(f"{kind} process failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if not result["ok"]:
        raise common.BenchError(f"{kind} found the generated chains broken: {result['problems']}")
    return result


def main() -> int:
    parser = common.parser_for(__doc__)
    parser.add_argument("--rows", type=int, help="audit rows [1000000]")
    parser.add_argument("--jobs", type=int, help="job chains [100000]")
    parser.add_argument("--child", choices=["verify", "walk"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0
    args = common.resolve_sizes(args, full=FULL, quick=QUICK)
    report = common.Report(NAME, args)
    with common.Scratch(NAME, keep=args.keep) as scratch:
        scratch.setup_django()
        check_payload_form(scratch)
        report.figure("load_seconds", round(load(scratch, rows=args.rows, jobs=args.jobs), 1), "s")
        with common.stopwatch() as checkpoint:
            scratch.manage("audit_checkpoint")
        report.figure("checkpoint_seconds", round(checkpoint["seconds"], 2), "s")
        verify = run_child(scratch, "verify")
        bare = run_child(scratch, "walk")
        report.extra("verify", verify)
        report.extra("walk", bare)
        report.figure("rows_verified", verify["rows"], "rows")
        report.compare(
            "verify_rows_per_s",
            label="verify_audit_chain",
            value=common.rate(verify["rows"], verify["seconds"]),
            unit="rows/s",
            baseline=common.rate(bare["rows"], bare["seconds"]),
            baseline_label="bare chain walk",
            absolute=150_000,
        )
        report.compare(
            "verify_peak_rss_mb",
            label="verify_audit_chain peak RSS",
            value=round(verify["peak_rss_kb"] / 1024, 1),
            unit="MB",
            baseline=round(bare["peak_rss_kb"] / 1024, 1),
            baseline_label="bare chain walk peak RSS",
            absolute=100,
            higher_is_better=False,
            note=f"(Django loaded: {verify['rss_after_setup_kb'] / 1024:.0f} MB)",
        )
        report.write(scratch)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
