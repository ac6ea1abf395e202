"""Benchmark: incremental verification of one day, 1,000,000 new entries (docs/benchmarks.md).

Scratch database `jobops_bench_audit_incremental`:

1. History before: --base-rows valid rows over --base-jobs chains by COPY (bench/_chains.py,
   checked first against a payload the app writes), then a checkpoint
   (`manage.py audit_checkpoint`), exported to AUDIT_CHECKPOINT_EXPORT.
2. One day after it: --rows new valid rows by COPY: new job chains of 10 entries, plus
   --continued of the older chains carrying on (their first new entry links to a head
   the trusted checkpoint names), then a checkpoint again.
3. In a fresh process: `manage.py verify_audit_chain --since-checkpoint HASH --json`, the
   hash that of step 1's checkpoint, timed with its peak RSS (VmHWM).
Target (issue 42): <= 15 s for 1,000,000 entries. Writes bench/results/audit_incremental.json.

Usage: python bench/audit_incremental.py [--rows 1000000] [--base-rows 200000] [--quick] [--keep]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as common
from bench._chains import COLUMNS, EVENTS, START, check_payload_form, copy_chains, payload_text

NAME = "audit_incremental"
FULL = {"rows": 1_000_000, "base_rows": 200_000, "continued": 10_000}
QUICK = {"rows": 50_000, "base_rows": 20_000, "continued": 500}
PER_JOB = 10


def continue_chains(conn: Any, heads: dict[str, str], *, per_job: int) -> int:
    """COPY `per_job` more entries onto each chain of `heads` (job -> head hex), seq 11 on."""
    from audit.partitions import part_for_job

    # The continued chains are this month's, as copy_chains loaded them (audit 0010).
    part = part_for_job(datetime.now(UTC)).isoformat()
    lines = []
    tick = 0
    for job, head in heads.items():
        prev = bytes.fromhex(head)
        chain = f"job:{job}"
        for r in range(PER_JOB, PER_JOB + per_job):
            tick += 1
            event, src, dst = EVENTS[r % len(EVENTS)]
            ts = (START + timedelta(days=1, microseconds=tick * 37)).strftime(
                "%Y-%m-%dT%H:%M:%S.%fZ"
            )
            text = payload_text(
                chain=chain, seq=r + 1, ts=ts, event=event, job=job, src=src, dst=dst, attempt=r
            )
            digest = hashlib.sha256(prev + text.encode()).digest()
            lines.append(
                f"{chain}\t{job}\t{r + 1}\t{event}\tsystem\tjobops\t{ts}\t{text}\t"
                f"{prev.hex()}\t{digest.hex()}\t{part}\n"
            )
            prev = digest
    columns = f"{COLUMNS}, part"
    with conn.cursor() as cursor, cursor.copy(f"COPY audit_logs ({columns}) FROM STDIN") as copy:
        for start in range(0, len(lines), 10_000):
            copy.write("".join(lines[start : start + 10_000]))
    return len(lines)


def load(scratch: common.Scratch, job_ids: list[str], *, continued: dict[str, str]) -> dict:
    """COPY new chains (and continue `continued`) with the triggers off for the load."""
    with scratch.connect(autocommit=False) as conn:
        conn.execute("ALTER TABLE audit_logs DISABLE TRIGGER USER")
        heads = copy_chains(conn, job_ids, per_job=PER_JOB, by_chain=False)
        if continued:
            continue_chains(conn, continued, per_job=PER_JOB)
        conn.execute("ALTER TABLE audit_logs ENABLE TRIGGER USER")
        conn.commit()
    with scratch.connect() as conn:
        conn.execute("VACUUM ANALYZE audit_logs")
    return heads


def child(trusted: str) -> None:
    """Runs in a fresh process; prints one JSON line (seconds, the report, peak RSS)."""
    import django

    django.setup()
    from django.core.management import call_command

    out = io.StringIO()
    cpu = time.process_time()
    started = time.perf_counter()
    try:
        call_command("verify_audit_chain", "--since-checkpoint", trusted, "--json", stdout=out)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu
    document = json.loads(out.getvalue())
    document["problems"] = document["problems"][:5]
    print(
        json.dumps(
            {
                "exit": code,
                "seconds": seconds,
                "cpu_seconds": cpu,
                "peak_rss_kb": common.peak_rss_kb(),
                **document,
            },
            default=str,
        )
    )


def main() -> int:
    parser = common.parser_for(__doc__)
    parser.add_argument("--rows", type=int, help="new audit rows after the checkpoint [1000000]")
    parser.add_argument("--base-rows", type=int, help="rows before the checkpoint [200000]")
    parser.add_argument("--continued", type=int, help="older chains carrying on [10000]")
    parser.add_argument("--child", metavar="HASH", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0
    args = common.resolve_sizes(args, full=FULL, quick=QUICK)
    report = common.Report(NAME, args)
    with common.Scratch(NAME, keep=args.keep) as scratch:
        export = Path(f"/tmp/{scratch.database}.checkpoints.jsonl")
        export.unlink(missing_ok=True)
        env = scratch.env(AUDIT_CHECKPOINT_EXPORT=str(export))
        scratch.setup_django(AUDIT_CHECKPOINT_EXPORT=str(export))
        check_payload_form(scratch)
        base_ids = [str(uuid.uuid4()) for _ in range(args.base_rows // PER_JOB)]
        with common.stopwatch() as timing:
            base_heads = load(scratch, base_ids, continued={})
        report.figure("base_load_seconds", round(timing["seconds"], 1), "s")
        scratch.manage("audit_checkpoint", env=env)
        trusted = json.loads(export.read_text().splitlines()[-1])["checkpoint_hash"]
        continued = dict(list(base_heads.items())[: args.continued])
        new_ids = [
            str(uuid.uuid4()) for _ in range((args.rows - len(continued) * PER_JOB) // PER_JOB)
        ]
        with common.stopwatch() as timing:
            load(scratch, new_ids, continued=continued)
        report.figure("day_load_seconds", round(timing["seconds"], 1), "s")
        with common.stopwatch() as timing:
            scratch.manage("audit_checkpoint", env=env)
        report.figure("day_checkpoint_seconds", round(timing["seconds"], 2), "s")
        done = subprocess.run(
            [sys.executable, __file__, "--child", trusted], env=env, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise common.BenchError(f"verify process failed:\n{done.stderr[-3000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        if result["exit"] != 0:
            raise common.BenchError(f"incremental verification failed: {result['problems']}")
        report.extra("verify", result)
        report.figure("rows_verified", result["rows_checked"], "rows")
        report.figure("streams", result["streams"], "")
        report.figure("peak_rss_mb", round(result["peak_rss_kb"] / 1024, 1), "MB")
        # The verifier's own CPU (its threads included; PostgreSQL's backends apart): what
        # the wall time comes to on cores nobody else uses.
        report.figure("verifier_cpu_seconds", round(result["cpu_seconds"], 2), "s")
        report.target(
            "incremental_seconds",
            label="verify --since-checkpoint, one day",
            value=round(result["seconds"], 2),
            unit="s",
            target=15,
            higher_is_better=False,
        )
        report.figure(
            "incremental_rows_per_s",
            common.rate(result["rows_checked"], result["seconds"]),
            "rows/s",
        )
        export.unlink(missing_ok=True)
        report.write(scratch)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
