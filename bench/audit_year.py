"""Benchmark: a year of audit history in a bounded database (issue 42 point 5; docs/benchmarks.md).

Scratch database `jobops_bench_audit_year`, as the postgres superuser (the owner of every
partition: `audit_detach` runs with the owner's credentials, never the app role's).
The retention is the settings' own (`sim` jobs: planning, 90 days, the longest).

1. The current month through the SQL functions: --current-jobs `sim` jobs of ten entries
   each through the services (created, queued, started, six progress, succeeded).
2. The past --months months (12: the year before the current month) get their partitions
   from the app's `audit_create_partitions()`, its now() replaced by each month's start
   (a copy in pg_temp). The ops chain of the whole year first (--ops-per-month entries a
   month, payloads from the app's audit_payload), a signed checkpoint
   (`checkpoint_write`) after each month, so that each month's segment ends at a head a
   checkpoint names: ops entries written later (the detaches') follow them all.
3. Then month by month, at the simulated instant the month ends:
   - --jobs job chains of ten entries by COPY (bench/_chains.py, `part` the month, each
     chain's entries spread over the month), their job rows cloned from a finished job
     (created_at in the month, audit_part the month); in the --straggler-months, a few
     jobs kept unpurgeable: an open dead letter, or a live idempotency key; a checkpoint;
   - retention: `manage.py purge` with every category's retention moved by the time from
     the simulated instant to now (so a job is due when it would be then), a checkpoint
     naming the `purged` entries, VACUUM of jobs;
   - the database's size (the peak, before anything leaves), then archive
     (`audit_archive --partition`) and detach (`audit_detach NAME --archive FILE`) of
     every partition that may go: the (empty) legacy partition first, each job partition
     whose jobs are all purged, each ops month as old as the job months that went
     (oldest first); then the size again.
4. One day: a checkpoint exported to AUDIT_CHECKPOINT_EXPORT, --day-entries new entries
   (job chains by COPY, with their rows), a checkpoint, then `verify_audit_chain
   --since-checkpoint HASH --json` in a fresh process.
5. The full verification over live + archives: `verify_audit_chain --archives DIR --json`.
6. One proof: a purged job's whose partition is live (`audit.proofs.job_proof`, what
   `audit_archive --proof` prints and the API returns): its size and its offline
   verification (in process, median of 20; and `verify_audit_chain --proof --public-key`).

Sizes: by default scaled to finish in about ten minutes on 2 cores: 10,000 jobs a month x
10 entries (1.2 M entries over the year), and the day at its real size, 1,000,000 entries
(--day-entries: a smaller day's time is scaled to a million). --full is the spec's
scale (100,000 jobs a day: 3,000,000 jobs a month, 30 M entries a month, 365 M a year;
a day of 1,000,000 entries): hours on this machine, a database of 110-140 GB at the
plateau (about 9.4 KB a job, indexes included) and archives of about 2.4 GB a month; not
run here.
Targets (issue 42): one day (1,000,000 entries) verified incrementally in <= 15 s; a proof
<= 8 KB verified in <= 100 ms; the database plateaus at the longest retention + 1 month
+ the partitions stragglers hold. Writes bench/results/audit_year.json.

Usage: python bench/audit_year.py [--months 12] [--jobs 10000] [--day-entries 1000000]
       [--current-jobs 50] [--full] [--quick] [--keep]
"""

from __future__ import annotations

import atexit
import io
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as common
from bench._chains import EVENTS, check_payload_form, copy_chains
from bench._jobflow import job_to_clone

NAME = "audit_year"
DEFAULT = {
    "months": 12,
    "jobs": 10_000,
    "day_entries": 1_000_000,
    "current_jobs": 50,
    "ops_per_month": 720,
}
QUICK = {"months": 6, "jobs": 1_000, "day_entries": 10_000, "current_jobs": 20, "ops_per_month": 30}
FULL = {
    "months": 12,
    "jobs": 3_000_000,
    "day_entries": 1_000_000,
    "current_jobs": 1_000,
    "ops_per_month": 720,
}
PER_JOB = len(EVENTS)
HELD = re.compile(r"held exclusively for ([0-9.]+) ms")
JOB_TYPE = "sim"  # planning: 90 days, the longest retention (config/settings.py)
# Of each straggler month's jobs: how many an open dead letter keeps, how many a live key.
STRAGGLERS = {"open dead letter": 2, "live idempotency key": 1}


def month_start(day: date, add: int = 0) -> date:
    index = day.year * 12 + day.month - 1 + add
    return date(index // 12, index % 12 + 1, 1)


def at(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


# --- setup ------------------------------------------------------------------------------
def create_past_partitions(scratch: common.Scratch, first: date) -> None:
    """The app's audit_create_partitions(), its now() replaced by `first` (a pg_temp copy):
    partitions of the past months made exactly as the dispatcher makes future ones."""
    with scratch.connect() as conn:
        body = conn.execute("SELECT pg_get_functiondef('audit_create_partitions'::regproc)")
        text = body.fetchone()[0]
        header = "public.audit_create_partitions()"
        if header not in text or "now()" not in text:
            raise common.BenchError("audit_create_partitions() changed: update bench/audit_year.py")
        text = text.replace(header, "pg_temp.bench_create_partitions(bench_at timestamptz)")
        conn.execute(text.replace("now()", "bench_at"))  # type: ignore[arg-type]
        month = first
        while month <= date.today():
            conn.execute("SELECT pg_temp.bench_create_partitions(%s)", [at(month)])
            month = month_start(month, 4)


def real_jobs(count: int) -> float:
    """`count` sim jobs of ten entries through the services; the seconds."""
    from audit.services import Actor
    from jobs.services import job_succeed
    from jobs.services.transitions import Progress, job_progress_audit
    from tests.factories import fence_of, job_in_state

    started = time.perf_counter()
    for _ in range(count):
        job = job_in_state("running", job_type=JOB_TYPE)
        fence = fence_of(job)
        for step in range(1, 7):
            job_progress_audit(
                job_id=job.id,
                fence=fence,
                progress=Progress(step * 14, f"step {step}", f"step {step} of 7"),
                actor=Actor.system(fence.locked_by),
            )
        job_succeed(job_id=job.id, fence=fence, result={"steps": 7})
    return time.perf_counter() - started


def seed_ops(scratch: common.Scratch, months: list[date], per_month: int) -> int:
    """The ops chain of every past month, a checkpoint after each month; the rows."""
    import hashlib

    from audit.canonical import GENESIS_HASH, canonical_bytes
    from audit.checkpoints import checkpoint_write
    from audit.services import Actor, audit_payload

    if scratch.scalar("SELECT count(*) FROM audit_logs WHERE chain = 'ops'"):
        raise common.BenchError("the ops chain has entries already: it must start with the year")
    actor = Actor.system("bench")
    prev, seq = GENESIS_HASH, 0
    for month in months:
        step = (at(month_start(month, 1)) - at(month)) / (per_month + 1)
        part = month.replace(day=2)
        with scratch.connect(autocommit=False) as conn:
            cols = "chain, job_id, seq, event_type, actor_type, actor_id, ts, payload, "
            cols += "prev_hash, chain_hash, part"
            with conn.cursor().copy(f"COPY audit_logs ({cols}) FROM STDIN") as copy:
                for n in range(per_month):
                    seq += 1
                    ts = at(month) + step * (n + 1)
                    data = {"queue": "sim", "reason": f"bench {n}"}
                    payload = canonical_bytes(
                        audit_payload(
                            chain="ops", seq=seq, ts=ts, event_type="queue_paused",
                            actor=actor, job_id=None, data=data,
                        )
                    )  # fmt: skip
                    digest = hashlib.sha256(bytes.fromhex(prev) + payload).hexdigest()
                    copy.write_row(
                        ("ops", None, seq, "queue_paused", actor.type, actor.id, ts,
                         payload.decode(), prev, digest, part)
                    )  # fmt: skip
                    prev = digest
            conn.commit()
        checkpoint_write()
    return seq


def clone_jobs(
    scratch: common.Scratch, ids: list[str], heads: dict[str, str], overrides: dict[str, str]
) -> None:
    """One job row per id, cloned from a finished job, `overrides` column expressions."""
    with scratch.connect(autocommit=False) as conn:
        template, columns = job_to_clone(conn, none_because="the current month's jobs made none")
        conn.execute("CREATE TEMP TABLE ids (id uuid, n bigint, head text) ON COMMIT DROP")
        with conn.cursor().copy("COPY ids (id, n, head) FROM STDIN") as copy:
            for n, job_id in enumerate(ids):
                copy.write_row((job_id, n, heads[job_id]))
        fixed = {
            "id": "ids.id",
            "audit_seq": str(PER_JOB),
            "audit_head": "ids.head",
            "idempotency_key": "NULL",
            "idempotency_expires_at": "NULL",
            "idempotency_last_seen_at": "NULL",
            "request_id": "NULL",
            "correlation_id": "NULL",
            **overrides,
        }
        select = ", ".join(fixed.get(c, f"t.{c}") for c in columns)
        conn.execute(
            f"INSERT INTO jobs ({', '.join(columns)}) "  # type: ignore[arg-type]
            f"SELECT {select} FROM ids, jobs t WHERE t.id = %s",
            [template],
        )
        conn.commit()


def load_jobs(
    scratch: common.Scratch, count: int, *, start: datetime, end: datetime, part: date
) -> list[str]:
    """`count` finished jobs whose chains (COPY, `part`) and rows lie between start and end."""
    ids = sorted(str(uuid.uuid4()) for _ in range(count))
    tick = max(1, int((end - start) / timedelta(microseconds=1) / (count * PER_JOB + 2)))
    partition = f"audit_logs_job_{part:%Y_%m}"
    with scratch.connect(autocommit=False) as conn:
        # The append-only triggers off for the load only (valid chains), as bench/scale.py.
        for table in ("audit_logs", partition):
            conn.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")  # type: ignore[arg-type]
        heads = copy_chains(
            conn, ids, per_job=PER_JOB, by_chain=True, start=start, tick_us=tick, part=part
        )
        for table in ("audit_logs", partition):
            conn.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")  # type: ignore[arg-type]
        conn.commit()
    first = f"TIMESTAMPTZ '{start.isoformat()}' + (ids.n * {PER_JOB} + 1) * interval '{tick} us'"
    clone_jobs(
        scratch,
        ids,
        heads,
        {
            "created_at": first,
            "updated_at": f"{first} + interval '{(PER_JOB - 1) * tick} us'",
            "audit_part": f"DATE '{part.isoformat()}'",
        },
    )
    return ids


def make_stragglers(scratch: common.Scratch, ids: list[str], month: date) -> dict[str, str]:
    """Keep a few of `ids` unpurgeable (STRAGGLERS); job id -> why."""
    why: dict[str, str] = {}
    chosen = iter(ids[:: max(1, len(ids) // 10)])
    with scratch.connect() as conn:
        for reason, count in STRAGGLERS.items():
            for n in range(count):
                job = next(chosen)
                why[job] = reason
                if reason == "open dead letter":
                    conn.execute(
                        "INSERT INTO dead_letters (queue, reason, error_code, error_message, "
                        "broker_copy, state, created_at, job_id) SELECT 'sim', 'exhausted', "
                        "'bench', 'a straggler', false, 'open', updated_at, id FROM jobs "
                        "WHERE id = %s",
                        [job],
                    )
                else:
                    conn.execute(
                        "UPDATE jobs SET idempotency_key = %s, idempotency_expires_at = now() + "
                        "interval '10 years', idempotency_last_seen_at = updated_at WHERE id = %s",
                        [f"bench-straggler-{month:%Y-%m}-{n}", job],
                    )
    return why


# --- retention, archive, detach ------------------------------------------------------
def purge_at(scratch: common.Scratch, sim_now: datetime) -> dict[str, Any]:
    """`manage.py purge` as it would run at `sim_now`: every category's retention moved by
    the time from then to now."""
    from django.conf import settings

    shift = (datetime.now(UTC) - sim_now).total_seconds()
    retention = ",".join(
        f"{category}={int(kept.total_seconds() + shift)}s"
        for category, kept in settings.JOBOPS_RETENTION.items()
    )
    with common.stopwatch() as t:
        out = scratch.manage("purge", "--json", env=scratch.env(JOBOPS_RETENTION=retention))
    done = json.loads(out)
    return {"jobs": sum(done["jobs"].values()), "seconds": round(t["seconds"], 2)}


def partitions(scratch: common.Scratch) -> list[tuple[str, int]]:
    """Every partition of audit_logs with its total size (bytes), by name."""
    with scratch.connect() as conn:
        return conn.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'audit_logs'::regclass "
            "ORDER BY 1"
        ).fetchall()


def sizes(scratch: common.Scratch) -> dict[str, Any]:
    parts = partitions(scratch)
    mb = 1024 * 1024
    return {
        "database_mb": round(scratch.scalar("SELECT pg_database_size(current_database())") / mb, 1),
        "audit_job_mb": round(sum(s for n, s in parts if "_job_" in n) / mb, 1),
        "audit_ops_mb": round(sum(s for n, s in parts if "_ops_" in n) / mb, 1),
        "jobs_mb": round(scratch.scalar("SELECT pg_total_relation_size('jobs')") / mb, 1),
    }


def past_job_partitions(scratch: common.Scratch, month: date) -> list[str]:
    """The job partitions attached of `month` and before (not the real current month's
    or the future ones, which exist throughout)."""
    last = f"audit_logs_job_{month:%Y_%m}"
    return [n for n, _ in partitions(scratch) if "_job_" in n and n <= last]


def live_job_months(scratch: common.Scratch) -> dict[date, int]:
    """Job partition month -> its job rows still there (jobs not yet purged)."""
    with scratch.connect() as conn:
        rows = conn.execute("SELECT audit_part, count(*) FROM jobs GROUP BY 1").fetchall()
    return dict(rows)


class Archiver:
    """Archive then detach, through the commands, in this process (Django loaded)."""

    def __init__(self, directory: Path) -> None:
        from django.core.management import get_commands

        self.directory = directory
        self.available = "audit_detach" in get_commands()
        self.runs: list[dict[str, Any]] = []

    def run(self, label: str, table: str) -> dict[str, Any]:
        from django.core.management import call_command
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {table}")  # type: ignore[arg-type]
            rows = cursor.fetchone()[0]
        path = self.directory / f"{table}.jsonl.gz"
        out = io.StringIO()
        with common.stopwatch() as archived:
            call_command("audit_archive", "--partition", label, "--out", str(path), stdout=out)
        with common.stopwatch() as detached:
            call_command("audit_detach", label, "--archive", str(path), stdout=out)
        run = {
            "partition": table,
            "rows": rows,
            "file_mb": round(path.stat().st_size / 1024 / 1024, 3),
            "archive_s": round(archived["seconds"], 3),
            "detach_s": round(detached["seconds"], 3),
            # What the command says it held audit_logs exclusively (DETACH and DROP).
            "held_ms": float(HELD.findall(out.getvalue())[-1])
            if HELD.search(out.getvalue())
            else None,
        }
        self.runs.append(run)
        return run


def due_partitions(
    scratch: common.Scratch, sim_now: datetime, retention: timedelta, held: set[date]
) -> list[tuple[str, str]]:
    """(label, table) of every attached partition that may go at `sim_now`, in order: the
    legacy one, then the months whose jobs are all purged (ops of the same age: a month's
    ops partition goes once its job partition could, ops oldest first)."""
    names = {name for name, _ in partitions(scratch)}
    left = live_job_months(scratch)
    due: list[tuple[str, str]] = []
    if "audit_logs_legacy" in names:
        due.append(("legacy", "audit_logs_legacy"))
    months = sorted({date(int(n[-7:-3]), int(n[-2:]), 1) for n in names if n[-7:-3].isdigit()})
    for month in months:
        if at(month_start(month, 1)) + retention > sim_now:
            break  # not yet due by age: nor any later month
        if f"audit_logs_ops_{month:%Y_%m}" in names:
            due.append((f"ops-{month:%Y-%m}", f"audit_logs_ops_{month:%Y_%m}"))
        if f"audit_logs_job_{month:%Y_%m}" in names:
            if left.get(month, 0) == 0:
                due.append((f"{month:%Y-%m}", f"audit_logs_job_{month:%Y_%m}"))
            else:
                held.add(month)
    return due


# --- the day, the full walk, the proof -----------------------------------------------------
def verify_process(scratch: common.Scratch, env: dict[str, str], *args: str) -> dict[str, Any]:
    """`manage.py verify_audit_chain ARGS --json` in a fresh process: its report, the
    verifier's own seconds (the report's) and the wall time (Django's start included)."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(common.ROOT / "manage.py"), "verify_audit_chain", *args, "--json"],
        cwd=common.ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.perf_counter() - started
    try:
        document = json.loads(done.stdout)
    except ValueError:
        raise common.BenchError(
            f"verify_audit_chain {' '.join(args)} exit {done.returncode}: {done.stderr[-2000:]}"
        ) from None
    return {"exit": done.returncode, "wall_s": round(wall, 2), **document}


def one_day(scratch: common.Scratch, entries: int, env: dict[str, str]) -> dict[str, Any]:
    from audit.checkpoints import checkpoint_write
    from audit.models import AuditCheckpoint

    # The newest checkpoint, exported when it was written: the day starts after it.
    trusted = checkpoint_write() or AuditCheckpoint.objects.order_by("-id").first()
    if trusted is None:
        raise common.BenchError("no checkpoint before the day")
    now = datetime.now(UTC)
    start = max(at(month_start(now.date())), now - timedelta(days=1))
    load_jobs(scratch, entries // PER_JOB, start=start, end=now, part=month_start(now.date()))
    checkpoint_write()
    with scratch.connect() as conn:
        conn.execute("VACUUM ANALYZE audit_logs")
    return verify_process(scratch, env, "--since-checkpoint", trusted.checkpoint_hash)


def proof_of_purged_job(scratch: common.Scratch, env: dict[str, str]) -> dict[str, Any]:
    """The proof of the newest purged job (its partition is live), built as the API and
    `audit_archive --proof` build it, and verified offline with the public key alone."""
    from audit.proofs import job_proof, verify_job_proof
    from audit.signing import public_key_text

    job_id = scratch.scalar(
        "SELECT job_id FROM audit_logs WHERE event_type = 'purged' ORDER BY id DESC LIMIT 1"
    )
    with common.stopwatch() as built:
        proof = job_proof(job_id)
    body = json.dumps(proof, separators=(",", ":")).encode()
    key = public_key_text()
    times = []
    for _ in range(20):
        started = time.perf_counter()
        result = verify_job_proof(json.loads(body), public_key=key)
        times.append(time.perf_counter() - started)
        if not result.ok:
            raise common.BenchError(f"the proof of {job_id} does not verify: {result.problems}")
    path = common.RESULTS_DIR / "audit_year.proof.json"
    path.write_bytes(body)
    process = verify_process(scratch, env, "--proof", str(path), "--public-key", key)
    return {
        "job_id": str(job_id),
        "bytes": len(body),
        "entries": len(proof["entries"]),
        "build_ms": round(built["seconds"] * 1000, 1),
        "verify_ms": round(statistics.median(times) * 1000, 2),
        "process_exit": process["exit"],
        "process_wall_s": process["wall_s"],
    }


# --- report ---------------------------------------------------------------------------------
def print_table(months: list[dict[str, Any]]) -> list[str]:
    """One line per simulated month's end: what came, what went, the sizes."""
    head = (
        "| month | jobs seeded | jobs purged | job partitions (before -> after) "
        "| partitions archived and detached | DB MB (before -> after) "
        "| audit MB after (job + ops) |"
    )
    lines = [head, "|" + "---|" * 7]
    for m in months:
        gone = ", ".join(p.replace("audit_logs_", "") for p in m["gone"]) or "-"
        lines.append(
            f"| {m['month']} | {m['seeded']:,} | {m['purged']:,} "
            f"| {m['live_peak']} -> {m['live_after']} | {gone} "
            f"| {m['peak']['database_mb']:,.0f} -> {m['after']['database_mb']:,.0f} "
            f"| {m['after']['audit_job_mb']:,.0f} + {m['after']['audit_ops_mb']:,.1f} |"
        )
    for line in lines:
        print("  " + line)
    return lines


def main() -> int:
    parser = common.parser_for(__doc__)
    parser.add_argument("--months", type=int, help="past months simulated [12]")
    parser.add_argument("--jobs", type=int, help="jobs a past month, ten entries each [10,000]")
    parser.add_argument("--day-entries", type=int, help="entries of the verified day [1,000,000]")
    parser.add_argument("--current-jobs", type=int, help="current month's jobs via services")
    parser.add_argument("--ops-per-month", type=int, help="ops chain entries a month [720]")
    parser.add_argument(
        "--straggler-months",
        default="2,5",
        help="1-based past months in which a few jobs stay unpurgeable [2,5]",
    )
    parser.add_argument("--full", action="store_true", help="the spec's scale (hours; see above)")
    args = parser.parse_args()
    sizes_table = FULL if args.full else DEFAULT
    args = common.resolve_sizes(args, full=sizes_table, quick=QUICK)
    report = common.Report(NAME, args)
    straggler_months = {int(x) for x in args.straggler_months.split(",") if x}
    archive_dir = Path(tempfile.mkdtemp(prefix="jobops-bench-audit-year-"))
    if args.keep:
        print(f"  archives and the checkpoint export in {archive_dir} (kept)")
    else:  # however the run ends, as the scratch database
        atexit.register(shutil.rmtree, archive_dir, True)
    export = archive_dir / "checkpoints.jsonl"
    with common.Scratch(NAME, keep=args.keep, topology=False) as scratch:
        env = scratch.env(AUDIT_CHECKPOINT_EXPORT=str(export), AUDIT_ARCHIVE_DIR=str(archive_dir))
        scratch.setup_django(
            AUDIT_CHECKPOINT_EXPORT=str(export), AUDIT_ARCHIVE_DIR=str(archive_dir)
        )
        from django.conf import settings

        from audit.checkpoints import checkpoint_write

        check_payload_form(scratch)
        seconds = real_jobs(args.current_jobs)
        report.figure(
            "current_jobs_per_s",
            common.rate(args.current_jobs, seconds),
            "jobs/s",
            f"current month: {args.current_jobs} jobs of 10 entries via the services",
        )
        today = datetime.now(UTC).date()
        months = [month_start(today, -n) for n in range(args.months, 0, -1)]
        create_past_partitions(scratch, months[0])
        with common.stopwatch() as t:
            ops_rows = seed_ops(scratch, months, args.ops_per_month)
        report.figure(
            "ops_rows", ops_rows, "rows", f"ops chain of the year in {t['seconds']:.1f} s"
        )
        retention = max(settings.JOBOPS_RETENTION.values())
        archiver = Archiver(archive_dir)
        if not archiver.available:
            print("  audit_detach is missing (branch hd not merged): no archive, no detach")
        stragglers: dict[str, tuple[str, str]] = {}  # job -> (partition, why)
        held: set[date] = set()
        rows: list[dict[str, Any]] = []
        seed_seconds = purge_seconds = 0.0
        for index, month in enumerate(months, 1):
            sim_now = at(month_start(month, 1))
            with common.stopwatch() as t:
                ids = load_jobs(scratch, args.jobs, start=at(month), end=sim_now, part=month)
                if index in straggler_months:
                    for job, why in make_stragglers(scratch, ids, month).items():
                        stragglers[job] = (f"audit_logs_job_{month:%Y_%m}", why)
                checkpoint_write()
            seed_seconds += t["seconds"]
            purged = purge_at(scratch, sim_now)
            purge_seconds += purged["seconds"]
            checkpoint_write()
            with scratch.connect() as conn:
                conn.execute("VACUUM ANALYZE jobs")
            peak = sizes(scratch)
            live_peak = past_job_partitions(scratch, month)
            gone = []
            if archiver.available:
                for label, table in due_partitions(scratch, sim_now, retention, held):
                    archiver.run(label, table)
                    gone.append(table)
            after = sizes(scratch)
            live_after = past_job_partitions(scratch, month)
            row = {
                "month": f"{month:%Y-%m}",
                "seeded": args.jobs,
                "purged": purged["jobs"],
                "purge_s": purged["seconds"],
                "gone": gone,
                "live_peak": len(live_peak),
                "peak_partitions": live_peak,
                "live_after": len(live_after),
                "live_partitions": live_after,
                "peak": peak,
                "after": after,
            }
            rows.append(row)
            print(
                f"  {row['month']}: seeded {args.jobs}, purged {purged['jobs']} in "
                f"{purged['seconds']} s, gone {gone or '-'}, DB {peak['database_mb']} -> "
                f"{after['database_mb']} MB, live job partitions {live_after}",
                flush=True,
            )
        report.extra("months", rows)
        report.figure("seed_seconds", round(seed_seconds, 1), "s", "seeding the past months")
        report.figure("purge_seconds", round(purge_seconds, 1), "s", "purging (12 runs)")
        table = print_table(rows)
        report.extra("table", table)
        # The plateau: the job partitions a month's end holds besides the stragglers'.
        held_names = {f"audit_logs_job_{m:%Y_%m}" for m in held}
        bound = math.ceil(retention / timedelta(days=30)) + 1
        steady = rows[bound:]
        worst = max(
            (len([p for p in r["peak_partitions"] if p not in held_names]) for r in steady),
            default=0,
        )
        if archiver.available:
            report.check(
                "plateau",
                label=f"job partitions at a month's end <= retention + 1 month ({bound})",
                ok=worst <= bound,
                detail=f"at most {worst} besides the stragglers' {sorted(held_names)}",
            )
        remaining = {}
        for job, (partition, why) in sorted(stragglers.items()):
            remaining.setdefault(partition, []).append(f"{job} ({why})")
        print("  partitions left past their retention, and the stragglers that hold them:")
        for partition, jobs in remaining.items():
            due = "held past its retention" if partition in held_names else "not yet due"
            print(f"    {partition} ({due}): {len(jobs)} jobs: {'; '.join(jobs)}")
        report.extra("stragglers", remaining)
        report.extra("partitions_left", [n for n, _ in partitions(scratch)])
        if archiver.runs:
            runs = archiver.runs
            job_runs = [r for r in runs if "_job_" in r["partition"]]
            total_rows = sum(r["rows"] for r in job_runs)
            total_mb = sum(r["file_mb"] for r in job_runs)
            archive_s = sum(r["archive_s"] for r in job_runs)
            detach_s = [r["detach_s"] for r in job_runs]
            report.figure(
                "archive_rows_per_s",
                common.rate(total_rows, archive_s),
                "rows/s",
                "archive (write + verify offline), job partitions",
            )
            report.figure(
                "archive_mb_per_s",
                round(total_mb / archive_s, 2) if archive_s else 0,
                "MB/s",
                "archive file written",
            )
            report.figure(
                "archive_s_per_partition",
                round(archive_s / len(job_runs), 2) if job_runs else 0,
                "s",
                f"per job partition ({len(job_runs)})",
            )
            report.figure(
                "detach_s_per_partition",
                round(statistics.median(detach_s), 3),
                "s",
                f"detach of a job partition (median of {len(job_runs)}; re-verifies the file)",
            )
            held = [r["held_ms"] for r in job_runs if r["held_ms"] is not None]
            if held:
                report.figure(
                    "detach_held_ms",
                    round(statistics.median(held), 1),
                    "ms",
                    "of which audit_logs held exclusively (median)",
                )
            report.extra("archives", runs)
        day = one_day(scratch, args.day_entries, env)
        seconds = float(day.get("seconds", day["wall_s"]))
        report.figure(
            "day_rows", int(day.get("rows_checked", 0)), "rows", "the day's entries checked"
        )
        report.target(
            "day_per_million_s",
            label="incremental, a day of 1,000,000 entries"
            + ("" if args.day_entries == 1_000_000 else f" (from {args.day_entries:,})"),
            value=round(seconds * 1_000_000 / max(1, args.day_entries), 1),
            unit="s",
            target=15,
            higher_is_better=False,
        )
        report.figure(
            "day_seconds",
            round(seconds, 2),
            "s",
            f"verify --since-checkpoint, {args.day_entries:,} entries (exit {day['exit']})",
        )
        report.check(
            "day_ok",
            label="incremental verification intact",
            ok=day["exit"] == 0,
            detail=str(day.get("problems", ""))[:300],
        )
        if archiver.available:
            full = verify_process(scratch, env, "--archives", str(archive_dir))
        else:
            full = verify_process(scratch, env)
        report.figure(
            "full_wall_seconds",
            full["wall_s"],
            "s",
            "full verification, live"
            + (" + archives (the process)" if archiver.available else " (the process)"),
        )
        report.figure(
            "full_live_seconds",
            float(full.get("seconds", 0)),
            "s",
            "of which the live database's walk",
        )
        report.figure(
            "full_rows", int(full.get("rows_checked", 0)), "rows", "full verification rows"
        )
        report.check(
            "full_ok",
            label="full verification intact",
            ok=full["exit"] == 0,
            detail=str(full.get("problems", ""))[:300],
        )
        report.extra("full_verification", {k: v for k, v in full.items() if k != "problems"})
        proof = proof_of_purged_job(scratch, env)
        report.target(
            "proof_bytes",
            label="a purged job's proof",
            value=proof["bytes"],
            unit="bytes",
            target=8 * 1024,
            higher_is_better=False,
        )
        report.target(
            "proof_verify_ms",
            label="its offline verification (median)",
            value=proof["verify_ms"],
            unit="ms",
            target=100,
            higher_is_better=False,
        )
        report.check(
            "proof_process",
            label="verify_audit_chain --proof exit 0",
            ok=proof["process_exit"] == 0,
            detail=f"{proof['process_wall_s']} s",
        )
        report.extra("proof", proof)
        report.extra("sizes_final", sizes(scratch))
        report.extra("loadavg_end", os.getloadavg())
        report.write(scratch)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
