"""Benchmark: the purge (issue 27 point 10; docs/operations/retention.md).

Scratch database and vhost `jobops_bench_retention`. The dispatcher runs as the
Procfile runs it (`--role maintain` beside `--role publish`), so that the purge is
measured where production runs it: in the maintain loop's `purge` step.

1. Seed --jobs finished jobs, set-based: their audit chains COPYed in chain order
   (bench/_chains.py; the audit triggers off for that COPY only, as bench/scale.py
   does), the jobs cloned server-side from a finished one (INSERT ... SELECT), one
   published outbox event each; VACUUM ANALYZE, CHECKPOINT. All but the last --alone
   ended three hours ago, those 90 minutes ago.
2. Baseline, before each pace (the load of a shared machine moves): the dispatcher
   with the default retention (nothing due), --measured jobs created one by one
   through `job_create` (each timed: the create p99), then --measured more created
   and drained by a worker (jobs/s).
3. For each --pace BATCH/PAUSE/STEP (JOBOPS_PURGE_BATCH, JOBOPS_PURGE_PAUSE_SECONDS,
   JOBOPS_PURGE_STEP_SECONDS; the settings' defaults unless given): the dispatcher with
   `JOBOPS_RETENTION=planning=2h` (the bench's `ai` jobs are `planning`) purges the
   jobs ended three hours ago in its own `purge` step while step 2 runs again: the
   purge's rate from the due jobs counted before and after (jobs/s, and rows/s: each
   job's `purged` entry, its row, its event) and the create p99 and drain rate beside
   it against the baseline just before (target: within 20 %); --repeat pairs of
   windows per pace, their medians.
4. `manage.py purge --older-than 1h` alone, no traffic, no pause between batches: the
   fastest a node purges, over what is left (the --alone jobs at least).
5. `verify_audit_chain --json` on sample purged jobs: their chains are complete.

Writes bench/results/retention.json (the load average at each window in it).

Usage: python bench/retention.py [--jobs 1000000] [--measured 1000] [--alone 200000]
       [--repeat 3] [--pace 500/0.05/0.5 ...] [--quick] [--keep]
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as common
from bench import scale
from bench._chains import EVENTS, copy_chains
from bench._jobflow import bench_user, create_and_drain, create_jobs

NAME = "retention"
FULL = {"jobs": 1_000_000, "measured": 1000, "alone": 200_000, "repeat": 3}
QUICK = {"jobs": 20_000, "measured": 200, "alone": 5_000, "repeat": 1}
HANDLERS = json.dumps({"ai": "bench._handlers.noop"})
# The paced phase's retention: the jobs ended three hours ago are due, the --alone
# ones (90 minutes) are kept for the unthrottled command; the measured jobs (made
# during the run) never are. `ai` is a planning type (config/settings.py JOB_TYPES).
PACED_RETENTION = "planning=2h"
DUE_AGE = "2 hours"
ENDED = (
    "now() - ids.n * interval '1 millisecond' - CASE WHEN ids.n < {due} "
    "THEN interval '3 hours' ELSE interval '90 minutes' END"
)
# Rows a purged seeded job writes or deletes: its `purged` entry, its row, its event.
ROWS_PER_JOB = 3
YEAR_OF_JOBS = 100_000 * 365


def create_latencies(count: int, owner: Any) -> dict[str, Any]:
    """`count` creations one at a time, each timed (ms)."""
    ms = []
    for _ in range(count):
        started = time.perf_counter()
        create_jobs(1, owner=owner)
        ms.append((time.perf_counter() - started) * 1000)
    return common.latency_summary(ms)


@contextmanager
def dispatchers(scratch: common.Scratch, env: dict[str, str]) -> Iterator[dict[str, Any]]:
    """The dispatchers as the Procfile runs them, once both loops run (a job created
    is published; the maintain loop's purge step has looked once)."""
    since = scratch.scalar("SELECT now()")
    services = common.start_dispatchers(bench=NAME, env=env)
    try:
        common.wait_until(
            lambda: scratch.scalar(
                "SELECT count(*) FROM purge_state WHERE checked_at > %s", [since]
            ),
            timeout=120,
            what="the maintain loop's purge step",
        )
        yield services
        for service in services.values():
            service.check_alive()
    finally:
        for service in services.values():
            service.stop()


def measure(
    scratch: common.Scratch, args: Any, owner: Any, services: dict[str, Any]
) -> dict[str, Any]:
    env = scratch.env(JOBOPS_HANDLERS=HANDLERS)
    loadavg = [round(x, 2) for x in os.getloadavg()]
    create = create_latencies(args.measured, owner)
    flow = create_and_drain(
        scratch, bench=NAME, env=env, jobs=args.measured, owner=owner, dispatchers=services
    )
    return {"create_ms": create, **flow, "loadavg_at_start": loadavg}


def seeded_left(scratch: common.Scratch, older_than: str = DUE_AGE) -> int:
    """Seeded jobs ended more than `older_than` ago (the paced phase's due ones by
    default) still there; the measured jobs are younger."""
    return int(
        scratch.scalar(
            "SELECT count(*) FROM jobs WHERE created_at < now() - %s::interval", [older_than]
        )
    )


def seed(scratch: common.Scratch, jobs: int, alone: int) -> dict[str, Any]:
    ids = sorted(str(uuid.uuid4()) for _ in range(jobs))
    with common.stopwatch() as t, scratch.connect(autocommit=False) as conn:
        conn.execute("ALTER TABLE audit_logs DISABLE TRIGGER USER")
        heads = copy_chains(conn, ids, per_job=len(EVENTS), by_chain=True)
        conn.execute("ALTER TABLE audit_logs ENABLE TRIGGER USER")
        conn.commit()
    audit_seconds = t["seconds"]
    ended = ENDED.format(due=jobs - alone)
    scale.CLONE_OVERRIDES.update(created_at=ended, updated_at=ended)
    with common.stopwatch() as t:
        scale.clone_jobs(scratch, ids, heads, len(EVENTS))
        scale.load_outbox(scratch, ids, 1)
        with scratch.connect() as conn:
            for table in ("jobs", "audit_logs", "event_outbox"):
                conn.execute(f"VACUUM ANALYZE {table}")  # type: ignore[arg-type]
            # The measurements must not pay for writing out the seed's dirty pages.
            conn.execute("CHECKPOINT")
    return {"ids": ids, "seconds": round(audit_seconds + t["seconds"], 1)}


def parse_pace(text: str) -> dict[str, str]:
    batch, pause, step = text.split("/")
    return {
        "JOBOPS_PURGE_BATCH": str(int(batch)),
        "JOBOPS_PURGE_PAUSE_SECONDS": str(float(pause)),
        "JOBOPS_PURGE_STEP_SECONDS": str(float(step)),
    }


def beside_purge(
    scratch: common.Scratch, args: Any, owner: Any, pace: dict[str, str]
) -> dict[str, Any]:
    """Step 3 for one pace: the dispatcher purges while jobs are created and drained."""
    env = scratch.env(JOBOPS_HANDLERS=HANDLERS, JOBOPS_RETENTION=PACED_RETENTION, **pace)
    with dispatchers(scratch, env) as services:
        before, started = seeded_left(scratch), time.monotonic()
        during = measure(scratch, args, owner, services)
        after, seconds = seeded_left(scratch), time.monotonic() - started
    return {
        **during,
        "pace": pace,
        "purged_jobs": before - after,
        "purge_seconds": round(seconds, 1),
        # No due job left before the window ended: the rate is a lower bound.
        "backlog_ran_out": after == 0,
    }


def median_of(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """The create p99 and drain rate of several windows, their medians."""
    return {
        "create_ms": {"p99_ms": statistics.median(w["create_ms"]["p99_ms"] for w in windows)},
        "jobs_per_s": statistics.median(w["jobs_per_s"] for w in windows),
        "loadavg_at_start": [statistics.median(w["loadavg_at_start"][0] for w in windows)],
    }


def purge_rate(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """The purge's rate over several windows: jobs gone over their time together."""
    gone, seconds = sum(w["purged_jobs"] for w in windows), sum(w["purge_seconds"] for w in windows)
    return {
        "purge_jobs_per_s": common.rate(gone, seconds),
        "purge_rows_per_s": common.rate(gone * ROWS_PER_JOB, seconds),
        "backlog_ran_out": any(w["backlog_ran_out"] for w in windows),
    }


def report_pace(
    report: common.Report, suffix: str, during: dict[str, Any], baseline: dict[str, Any]
) -> None:
    """The figures of one pace; `suffix` tells paces apart (none for the first)."""
    label = f"purge at {during['pace_text']}"
    note = f"load {during['loadavg_at_start'][0]}" + (
        "; backlog ran out: a lower bound" if during["backlog_ran_out"] else ""
    )
    report.figure(f"purge_jobs_per_s{suffix}", during["purge_jobs_per_s"], "jobs/s", label)
    report.figure(f"purge_rows_per_s{suffix}", during["purge_rows_per_s"], "rows/s", label)
    for key, what, unit, value, base in (
        (
            "create_p99_ms",
            "create p99",
            "ms",
            during["create_ms"]["p99_ms"],
            baseline["create_ms"]["p99_ms"],
        ),
        ("drain_per_s", "drain", "jobs/s", during["jobs_per_s"], baseline["jobs_per_s"]),
    ):
        higher = unit == "jobs/s"
        report.compare(
            key + suffix,
            label=f"{what} beside it",
            value=value,
            unit=unit,
            baseline=base,
            baseline_label="same, no purge",
            target=0.8 if higher else 1.2,
            higher_is_better=higher,
            note=note,
        )


def main() -> int:
    parser = common.parser_for(__doc__)
    parser.add_argument("--jobs", type=int, help="finished jobs seeded [1,000,000]")
    parser.add_argument("--measured", type=int, help="jobs created (and drained) per phase")
    parser.add_argument("--alone", type=int, help="of --jobs, kept for the unthrottled purge")
    parser.add_argument("--repeat", type=int, help="baseline/purge window pairs per pace")
    parser.add_argument(
        "--pace",
        action="append",
        metavar="BATCH/PAUSE/STEP",
        help="the dispatcher's purge pace, one window each [the settings' defaults]",
    )
    args, report = common.prepare(NAME, parser, full=FULL, quick=QUICK)
    with common.Scratch(NAME, keep=args.keep) as scratch:
        scratch.setup_django(JOBOPS_HANDLERS=HANDLERS)
        from django.conf import settings

        paces = args.pace or [
            f"{settings.JOBOPS_PURGE_BATCH}/{settings.JOBOPS_PURGE_PAUSE_SECONDS}"
            f"/{settings.JOBOPS_PURGE_STEP_SECONDS}"
        ]
        owner = bench_user("bench-retention")
        with dispatchers(scratch, scratch.env(JOBOPS_HANDLERS=HANDLERS)) as services:
            # Warm-up, and the finished jobs the seed clones.
            create_and_drain(
                scratch,
                bench=NAME,
                env=scratch.env(JOBOPS_HANDLERS=HANDLERS),
                jobs=50,
                owner=owner,
                dispatchers=services,
            )
        seeded = seed(scratch, args.jobs, args.alone)
        report.figure("seeded_jobs", args.jobs, "jobs", f"seeded in {seeded['seconds']} s")
        windows = []
        for n, text in enumerate(paces):
            # Each pace against baselines measured just before each of its windows, the
            # medians of --repeat pairs: on a shared machine the load of the minute
            # moves these figures more than the purge does.
            pairs = []
            for _ in range(args.repeat):
                with dispatchers(scratch, scratch.env(JOBOPS_HANDLERS=HANDLERS)) as services:
                    base = measure(scratch, args, owner, services)
                pairs.append((base, beside_purge(scratch, args, owner, parse_pace(text))))
            baseline, during = median_of([b for b, _ in pairs]), median_of([d for _, d in pairs])
            during |= purge_rate([d for _, d in pairs]) | {"pace_text": text}
            windows.append({"baseline": baseline, "during": during, "pairs": pairs})
            suffix = "" if n == 0 else "_" + text.replace("/", "_").replace(".", "p")
            report_pace(report, suffix, during, baseline)
        report.extra("windows", windows)
        left = seeded_left(scratch, "1 hour")
        loadavg = round(os.getloadavg()[0], 2)
        with common.stopwatch() as t:
            removed = json.loads(
                scratch.manage(
                    "purge",
                    "--older-than",
                    "1h",
                    "--json",
                    env=scratch.env(JOBOPS_HANDLERS=HANDLERS),
                )
            )
        purged = sum(removed["jobs"].values())
        rows = purged * 2 + removed["outbox"]
        label = f"unthrottled, alone ({purged} jobs, load {loadavg})"
        fastest = report.figure(
            "alone_purge_jobs_per_s", common.rate(purged, t["seconds"]), "jobs/s", label
        )
        report.figure("alone_purge_rows_per_s", common.rate(rows, t["seconds"]), "rows/s", label)
        # The year at the first pace (the settings' own unless --pace is given).
        paced = windows[0]["during"]["purge_jobs_per_s"]
        for key, rate_ in (("year_hours_paced", paced), ("year_hours_alone", fastest)):
            report.figure(
                key,
                round(YEAR_OF_JOBS / rate_ / 3600, 1) if rate_ else None,
                "h",
                f"a year of 100,000 jobs/day, {key.rsplit('_', 1)[1]}",
            )
        sample = random.sample(seeded["ids"], 3)
        verified = json.loads(
            scratch.manage(
                "verify_audit_chain", "--json", *[a for j in sample for a in ("--job", j)]
            )
        )
        gone = args.jobs - seeded_left(scratch, "1 hour")
        report.check(
            "purged_chains_verify",
            label="purged chains verify (3 sample jobs)",
            ok=gone == args.jobs and purged == left and bool(verified.get("ok")),
            detail=f"purged {gone} of {args.jobs}, problems {verified.get('problems_total')}",
        )
        report.extra("removed_alone", removed)
        report.write(scratch)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
