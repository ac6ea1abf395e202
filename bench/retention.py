"""Benchmark: the purge (issue 27 point 10; docs/operations/retention.md).

Scratch database and vhost `jobops_bench_retention`.

1. Baseline: --measured jobs created one by one through `job_create` (each timed: the
   create p99), then --measured more created and drained by a worker (jobs/s).
2. Seed --jobs finished jobs due for the purge, set-based: their audit chains COPYed in
   chain order (bench/_chains.py; the audit triggers off for that COPY only, as
   bench/scale.py does), the jobs cloned server-side from a finished one (INSERT ...
   SELECT) as ended two hours ago, one published outbox event each; VACUUM ANALYZE.
3. `manage.py purge --older-than 1h` in its own process (no pause between batches: the
   fastest a node purges) while step 1 runs again: the purge's rate (jobs/s and rows/s:
   each job's `purged` entry, its row, its event) and the create p99 and drain rate
   beside it against the baseline (target: within 20 %).
4. `verify_audit_chain --json` on sample purged jobs: their chains are complete.

Writes bench/results/retention.json.

Usage: python bench/retention.py [--jobs 1000000] [--measured 1000] [--quick] [--keep]
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as common
from bench import scale
from bench._chains import EVENTS, copy_chains
from bench._jobflow import bench_user, create_and_drain, create_jobs

NAME = "retention"
FULL = {"jobs": 1_000_000, "measured": 1000}
QUICK = {"jobs": 5_000, "measured": 200}
HANDLERS = json.dumps({"ai": "bench._handlers.noop"})
# The seeded jobs ended two hours ago: due for `--older-than 1h`, which the measured
# jobs (made during the run) are not.
ENDED = "now() - interval '2 hours' - ids.n * interval '1 millisecond'"


def create_latencies(count: int, owner: Any) -> dict[str, Any]:
    """`count` creations one at a time, each timed (ms)."""
    ms = []
    for _ in range(count):
        started = time.perf_counter()
        create_jobs(1, owner=owner)
        ms.append((time.perf_counter() - started) * 1000)
    return common.latency_summary(ms)


def measure(scratch: common.Scratch, args: Any, owner: Any) -> dict[str, Any]:
    env = scratch.env(JOBOPS_HANDLERS=HANDLERS)
    dispatcher = common.start_dispatcher(bench=NAME, env=env)
    try:
        create = create_latencies(args.measured, owner)
        flow = create_and_drain(scratch, bench=NAME, env=env, jobs=args.measured, owner=owner)
        dispatcher.check_alive()
    finally:
        dispatcher.stop()
    return {"create_ms": create, **flow}


def seed(scratch: common.Scratch, jobs: int) -> dict[str, Any]:
    ids = sorted(str(uuid.uuid4()) for _ in range(jobs))
    with common.stopwatch() as t, scratch.connect(autocommit=False) as conn:
        conn.execute("ALTER TABLE audit_logs DISABLE TRIGGER USER")
        heads = copy_chains(conn, ids, per_job=len(EVENTS), by_chain=True)
        conn.execute("ALTER TABLE audit_logs ENABLE TRIGGER USER")
        conn.commit()
    audit_seconds = t["seconds"]
    scale.CLONE_OVERRIDES.update(created_at=ENDED, updated_at=ENDED)
    with common.stopwatch() as t:
        scale.clone_jobs(scratch, ids, heads, len(EVENTS))
        scale.load_outbox(scratch, ids, 1)
        with scratch.connect() as conn:
            for table in ("jobs", "audit_logs", "event_outbox"):
                conn.execute(f"VACUUM ANALYZE {table}")  # type: ignore[arg-type]
    return {
        "ids": ids,
        "audit_rows": jobs * len(EVENTS),
        "seconds": round(audit_seconds + t["seconds"], 1),
    }


def main() -> int:
    parser = common.parser_for(__doc__)
    parser.add_argument("--jobs", type=int, help="finished jobs due [1,000,000]")
    parser.add_argument("--measured", type=int, help="jobs created (and drained) per phase")
    args, report = common.prepare(NAME, parser, full=FULL, quick=QUICK)
    with common.Scratch(NAME, keep=args.keep) as scratch:
        scratch.setup_django(JOBOPS_HANDLERS=HANDLERS)
        owner = bench_user("bench-retention")
        create_jobs(50, owner=owner)  # warm-up, and the finished job the seed clones
        baseline = measure(scratch, args, owner)
        seeded = seed(scratch, args.jobs)
        report.figure("seeded_jobs", args.jobs, "jobs", f"seeded in {seeded['seconds']} s")
        started = time.monotonic()
        purge = subprocess.Popen(
            [
                sys.executable,
                str(common.ROOT / "manage.py"),
                "purge",
                "--older-than",
                "1h",
                "--json",
            ],
            cwd=common.ROOT,
            env=scratch.env(JOBOPS_HANDLERS=HANDLERS),
            stdout=subprocess.PIPE,
            text=True,
        )
        # The purge's own end, whether it comes before the measurement's or after.
        ended: dict[str, Any] = {}
        waiter = threading.Thread(
            target=lambda: ended.update(out=purge.communicate()[0], at=time.monotonic())
        )
        waiter.start()
        during = measure(scratch, args, owner)
        measured_until = time.monotonic() - started
        waiter.join()
        out, purge_seconds = ended["out"], ended["at"] - started
        removed = json.loads(out)
        purged = sum(removed["jobs"].values())
        # Rows written or deleted per job: its `purged` entry, its row, its outbox event.
        rows = purged * 2 + removed["outbox"]
        report.figure("purge_jobs_per_s", common.rate(purged, purge_seconds), "jobs/s", "purge")
        report.figure("purge_rows_per_s", common.rate(rows, purge_seconds), "rows/s", "purge")
        report.figure(
            "purge_overlap",
            round(min(1.0, measured_until / purge_seconds), 2),
            "",
            "share of the purge the measurement ran beside",
        )
        for key, label, value, base, higher in (
            (
                "create_p99_ms",
                "create p99 beside the purge",
                during["create_ms"]["p99_ms"],
                baseline["create_ms"]["p99_ms"],
                False,
            ),
            (
                "drain_per_s",
                "drain beside the purge",
                during["jobs_per_s"],
                baseline["jobs_per_s"],
                True,
            ),
        ):
            report.compare(
                key,
                label=label,
                value=value,
                unit="jobs/s" if higher else "ms",
                baseline=base,
                baseline_label="same, no purge",
                target=0.8 if higher else 1.2,
                higher_is_better=higher,
            )
        sample = random.sample(seeded["ids"], 3)
        verified = json.loads(
            scratch.manage(
                "verify_audit_chain", "--json", *[a for j in sample for a in ("--job", j)]
            )
        )
        report.check(
            "purged_chains_verify",
            label="purged chains verify (3 sample jobs)",
            ok=purged == args.jobs and bool(verified.get("ok")),
            detail=f"purged {purged} of {args.jobs}, problems {verified.get('problems_total')}",
        )
        report.extra("baseline", baseline)
        report.extra("during", during)
        report.extra("removed", removed)
        report.write(scratch)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
