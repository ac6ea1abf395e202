"""Benchmark: jobops no-op jobs end to end vs raw Celery no-op tasks (docs/benchmarks.md).

Same broker, same worker settings (prefork, concurrency, prefetch, acks late, quorum
queue, jobops' consumer), scratch database and vhost `jobops_bench_e2e`:

1. Raw Celery: N tasks published, then a worker started; tasks/s = N / (first start ->
   last done). Run before and after jobops; the ratio uses their mean, so that a
   change in machine load during the run favours neither side.
2. jobops drain: the dispatcher runs (as in `make run`); N no-op `ai` jobs are created
   through `job_create` (creation rate, one at a time as one API worker would); once
   none is `pending` (published, confirmed), a worker starts; jobs/s = N / (first
   `started` -> last `succeeded`, from the audit trail).
3. Capacity: with the worker running, N jobs submitted back to back through
   `job_create` (one submitter, as one API worker); jobs/s = N / (first created ->
   last `succeeded`). This is the whole path of a submission (creation, publishing,
   both transitions, the events) on the same cores; the drain leaves out creation
   and publishing, and half of it was 60-90 % of this on two cores.
4. Latency: with the worker running, M jobs submitted at a fixed rate (half the
   capacity of 3 unless --latency-rate); submit -> start and submit -> done
   p50/p99 (issue 10: submit -> start p99 under 50 ms at half capacity).
5. Peak worker memory (RSS and PSS over the worker's process tree).
6. --profile: web (gunicorn), dispatcher and a solo-pool worker with the SQL trace
   and the worker under cProfile; P jobs POSTed one at a time; prints statements,
   round trips and transactions per job per process, the most frequent statements,
   and where the worker's Python time goes. Raw traces and worker.prof stay in
   bench/results/e2e-profile/.

Prints each figure beside its baseline, writes bench/results/e2e.json.

Usage: python bench/e2e.py [--jobs 2000] [--latency-jobs 500] [--latency-rate R]
       [--concurrency 2] [--prefetch 3] [--profile] [--profile-jobs 200] [--quick]
       [--keep] [--executor postgres [--pool threads|processes] [--worker-prefetch N]]

--executor postgres: the postgres executor's arm instead (`measure_postgres`): the
no-op drain by `manage.py run_worker` (thread runners unless --pool processes), its
CPU per job and submit -> start at half that rate, against the same raw Celery
baseline.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as common
from bench import _profiling
from bench._jobflow import (
    audit_times,
    bench_user,
    create_and_drain,
    create_jobs,
    created_times,
    drain_rate,
    start_times,
    status_counts,
    user_token,
    wait_for_status,
    wait_then_stop,
)

NAME = "e2e"
# Sizes of `make bench`, and of --quick (seconds, for development).
FULL = {"jobs": 2000, "latency_jobs": 500, "profile_jobs": 200}
QUICK = {"jobs": 300, "latency_jobs": 100, "profile_jobs": 50}
JOB_TYPE, JOB_QUEUE, PARAMS = "ai", "default", {"text": "x"}
HANDLERS = json.dumps({JOB_TYPE: "bench._handlers.noop"})
PROFILE_DIR = common.RESULTS_DIR / "e2e-profile"


def run_raw(
    scratch: common.Scratch, args: argparse.Namespace, dispatchers: dict[str, common.Service]
) -> dict[str, Any]:
    """Raw Celery tasks/s (bench/_raw_celery.py), and the CPU ms per task by process."""
    import redis

    from bench import _raw_celery

    key = f"{scratch.redis_prefix}:raw"
    client = redis.Redis.from_url(scratch.redis_url)
    client.delete(f"{key}:first", f"{key}:last", f"{key}:done")
    env = scratch.env(BENCH_RAW_KEY=key)
    _raw_celery.app.conf.broker_url = scratch.broker_url
    _raw_celery.publish(args.jobs)
    worker = common.start_worker(
        bench=NAME,
        env=env,
        queues=_raw_celery.QUEUE,
        app="bench._raw_celery",
        concurrency=args.concurrency,
        prefetch=args.prefetch,
        role="raw-worker",
    )
    try:
        with common.CpuSampler({"worker": worker, **dispatchers}, database=scratch.database) as cpu:
            common.wait_until(
                lambda: worker.check_alive() or int(client.get(f"{key}:done") or 0) >= args.jobs,
                timeout=900,
                what="raw Celery tasks",
            )
    finally:
        worker.stop()
    first, last = float(client.get(f"{key}:first") or 0), float(client.get(f"{key}:last") or 0)
    client.close()
    return {
        "tasks": args.jobs,
        "seconds": round(last - first, 3),
        "tasks_per_s": common.rate(args.jobs, last - first),
        "cpu_ms_per_task": cpu.ms_per_item(first, last, args.jobs),
    }


def _job_worker(args: argparse.Namespace, env: dict[str, str]) -> common.Service:
    """The worker that runs the jobs of the capacity and latency phases."""
    return common.start_worker(
        bench=NAME, env=env, queues=JOB_QUEUE, concurrency=args.concurrency, prefetch=args.prefetch
    )


def run_capacity(
    scratch: common.Scratch,
    args: argparse.Namespace,
    env: dict[str, str],
    dispatchers: dict[str, common.Service],
) -> dict[str, Any]:
    """The rate the whole path keeps up with: jobs created back to back while a worker
    runs them, so that creating, publishing and running share the cores as they do in
    production. The submitter's own CPU (an API worker's part) is counted too."""
    owner = bench_user("bench-e2e")
    worker = _job_worker(args, env)
    with common.CpuSampler(
        {"worker": worker, **dispatchers}, this_process="submitter", database=scratch.database
    ) as cpu:
        ids, _seconds = create_jobs(args.jobs, owner=owner)
        wait_then_stop(
            scratch,
            worker,
            job_ids=ids,
            status="succeeded",
            timeout=max(300, args.jobs),
            what="the capacity jobs",
        )
    first = min(created_times(scratch, ids).values())
    last = max(audit_times(scratch, events=("succeeded",), job_ids=ids)["succeeded"].values())
    return {
        "jobs": len(ids),
        "seconds": round(last - first, 3),
        "jobs_per_s": common.rate(len(ids), last - first),
        "cpu_ms_per_job": cpu.ms_per_item(first, last, len(ids)),
    }


def _submit_at_rate(owner: Any, count: int, per_s: float) -> tuple[list[str], float, float]:
    """`count` no-op jobs created at `per_s` a second, open loop (a slow creation does
    not push the next one's time back); their ids, and the wall clock at the first and
    after the last (the window a CpuSampler is read over)."""
    from jobs.services import job_create

    ids: list[str] = []
    interval, next_at = 1.0 / per_s, time.monotonic()
    first = time.time()
    for _ in range(count):
        next_at += interval
        job, _created = job_create(owner=owner, job_type=JOB_TYPE, params=PARAMS)
        ids.append(str(job.id))
        time.sleep(max(0.0, next_at - time.monotonic()))
    return ids, first, time.time()


def run_latency(
    scratch: common.Scratch,
    args: argparse.Namespace,
    env: dict[str, str],
    per_s: float,
    dispatchers: dict[str, common.Service],
) -> dict[str, Any]:
    """Open loop at a fixed rate below capacity: the figures are the pipeline's
    latency, not the wait in a queue that a saturating submitter would build. The CPU
    per job of each process (this submitting one included) says how close to
    saturation the rate was: a tail grows long as the two cores fill."""
    owner = bench_user("bench-e2e")
    worker = _job_worker(args, env)
    with common.CpuSampler(
        {"worker": worker, **dispatchers}, this_process="submitter", database=scratch.database
    ) as cpu:
        ids, first, last = _submit_at_rate(owner, args.latency_jobs, per_s)
        wait_then_stop(
            scratch, worker, job_ids=ids, status="succeeded", timeout=900, what="the latency jobs"
        )
    to_start, to_done = start_times(scratch, ids)
    return {
        "jobs": len(ids),
        "submit_rate_per_s": round(per_s, 1),
        # The steady state: while jobs came in at the rate.
        "cpu_ms_per_job": cpu.ms_per_item(first, last, len(ids)),
        "submit_to_start": common.latency_summary(to_start),
        "submit_to_done": common.latency_summary(to_done),
        "peak_worker_rss_bytes": worker.peak_rss,
        "peak_worker_pss_bytes": worker.peak_pss,
    }


# --- profile ------------------------------------------------------------------------------
def run_profile(
    scratch: common.Scratch, args: argparse.Namespace, report: common.Report
) -> dict[str, Any]:
    """Statements, round trips and Python time per job, per process (issue 10, point 1).

    1. Web (1 gunicorn worker), dispatcher and a solo worker start with the SQL trace
       on; the worker also under cProfile.
    2. Warm-up jobs run first (imports, connections, caches), then an idle window
       measures the dispatcher's own polling, so that it can be taken off the count.
    3. P jobs are POSTed one at a time and run; the counts between the two snapshots,
       divided by P, are the cost of one job.
    """
    import requests

    shutil.rmtree(PROFILE_DIR, ignore_errors=True)
    PROFILE_DIR.mkdir(parents=True)
    prof_path = PROFILE_DIR / "worker.prof"
    owner = bench_user("bench-e2e-profile")
    headers = {"Authorization": f"Token {user_token(owner)}"}

    def env_for(role: str, **extra: str) -> dict[str, str]:
        return scratch.env(
            JOBOPS_HANDLERS=HANDLERS,
            BENCH_TRACE_DIR=str(PROFILE_DIR),
            BENCH_ROLE=role,
            **extra,
        )

    web, base = common.start_gunicorn(
        bench=NAME, env=env_for("web"), workers=1, probe="/api/v1/jobs", headers=headers
    )
    dispatcher = common.start_dispatcher(bench=NAME, env=env_for("dispatcher"))
    worker = common.start_worker(
        bench=NAME,
        env=env_for("worker", BENCH_CPROFILE=str(prof_path)),
        queues=JOB_QUEUE,
        concurrency=1,
        pool="solo",
        role="profile-worker",
    )
    session = requests.Session()
    session.headers.update(headers)

    def post(n: int) -> list[str]:
        ids = []
        for _ in range(n):
            response = session.post(
                f"{base}/api/v1/jobs", json={"type": JOB_TYPE, "params": PARAMS}, timeout=30
            )
            if response.status_code != 201:
                raise common.BenchError(
                    f"POST /api/v1/jobs: {response.status_code} {response.text}"
                )
            ids.append(response.json()["id"])
        wait_for_status(
            scratch,
            count=n,
            statuses=("succeeded",),
            job_ids=ids,
            timeout=600,
            what="the profiled jobs to succeed",
            watch=[web, dispatcher, worker],
        )
        return ids

    services = {"web": web, "dispatcher": dispatcher, "worker": worker}

    def snapshot() -> tuple[dict[str, _profiling.TraceCounts], dict[str, float], float]:
        time.sleep(1.2)  # the processes flush their trace twice a second
        cpu = {role: service.cpu_seconds() for role, service in services.items()}
        return _profiling.read_traces(PROFILE_DIR), cpu, time.monotonic()

    post(5)
    idle_from, cpu_idle_from, idle_started = snapshot()
    time.sleep(3.0)
    idle_to, cpu_idle_to, idle_ended = snapshot()
    post(args.profile_jobs)
    after, cpu_after, ended = snapshot()
    worker.stop(timeout=60)  # warm shutdown: the worker dumps its profile
    web.stop()
    dispatcher.stop()

    jobs, empty = args.profile_jobs, _profiling.TraceCounts()
    scale = (ended - idle_ended) / (idle_ended - idle_started)
    rows: dict[str, dict[str, Any]] = {}
    for role in services:
        rows[role] = _profiling.per_job(
            phase=after.get(role, empty).minus(idle_to.get(role, empty)),
            idle=idle_to.get(role, empty).minus(idle_from.get(role, empty)),
            jobs=jobs,
            idle_scale=scale,
        )
        idle_cpu = cpu_idle_to[role] - cpu_idle_from[role]
        rows[role]["cpu_ms"] = round(
            (cpu_after[role] - cpu_idle_to[role] - idle_cpu * scale) / jobs * 1000, 2
        )
    rows["total"] = {
        key: round(sum(rows[r][key] for r in services), 2)
        for key in ("statements", "round_trips", "transactions", "cpu_ms")
    }
    python = _profiling.profile_summary(prof_path) if prof_path.exists() else {}
    summary = {
        "jobs": jobs,
        "per_job": rows,
        "worker_task_python": python,
        "worker_task_ms_per_job": (
            round(python["total_seconds"] / jobs * 1000, 2) if python else None
        ),
        "raw": str(PROFILE_DIR.relative_to(common.RESULTS_DIR.parent.parent)),
    }
    (PROFILE_DIR / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print_profile(summary)
    for key in ("statements", "round_trips", "cpu_ms"):
        report.figure(f"profile_{key}_per_job", rows["total"][key], f"{key}/job")
    return summary


def print_profile(summary: dict[str, Any]) -> None:
    rows = summary["per_job"]
    print(f"  profile over {summary['jobs']} jobs (POST, dispatch, run), per job:")
    print(
        f"    {'process':<12}{'statements':>11}{'round trips':>13}{'transactions':>14}{'CPU ms':>9}"
    )
    for role, row in rows.items():
        print(
            f"    {role:<12}{row['statements']:>11.2f}{row['round_trips']:>13.2f}"
            f"{row['transactions']:>14.2f}{row['cpu_ms']:>9.2f}"
        )
    print("    (the dispatcher's idle polling, measured before, is taken off its counts)")
    for role, row in rows.items():
        if role == "total":
            continue
        print(f"    most frequent statements per job, {role}:")
        for n, shape in row["top_statements"][:8]:
            print(f"      {n:>5.2f}  {shape[:105]}")
    python = summary["worker_task_python"]
    if python:
        print(
            f"    worker task path (prerun..postrun) under cProfile: "
            f"{summary['worker_task_ms_per_job']} ms/job wall; own time by package:"
        )
        for group, seconds in python["by_group"].items():
            print(f"      {seconds / python['total_seconds'] * 100:5.1f} %  {group}")
        print("    top functions by own time:")
        for row in python["top"][:12]:
            print(f"      {row['own_s']:>7.3f} s {row['calls']:>8} calls  {row['function'][:90]}")


def _cpu_figure(report: common.Report, name: str, label: str, spent: dict[str, float]) -> None:
    """A CpuSampler.ms_per_item reading as one figure: the total, each process's share
    in the label (the ratio's explanation, in every run)."""
    report.figure(name, spent["total"], "CPU ms", f"{label}, " + common.by_role(spent))


def _raw_celery(report: common.Report, before: dict[str, Any], after: dict[str, Any]) -> float:
    """Raw Celery's runs before and after an arm, kept; their mean is the arm's baseline."""
    mean = round((before["tasks_per_s"] + after["tasks_per_s"]) / 2, 1)
    report.extra("raw_celery", {"before": before, "after": after, "mean": mean})
    return mean


def _drain_against_raw(
    report: common.Report, name: str, *, label: str, jobs_per_s: float, raw: float, target: float
) -> None:
    report.compare(
        name,
        label=label,
        value=jobs_per_s,
        unit="jobs/s",
        baseline=raw,
        baseline_label="raw Celery (mean of 2)",
        target=target,
    )


def _submit_to_start(
    report: common.Report, prefix: str, start: dict[str, Any], *, target_ms: float
) -> None:
    report.figure(f"{prefix}submit_to_start_p50_ms", start["p50_ms"], "ms", "submit -> start p50")
    report.target(
        f"{prefix}submit_to_start_p99_ms",
        label="submit -> start p99",
        value=float(start["p99_ms"] or 0),
        unit="ms",
        target=target_ms,
        higher_is_better=False,
    )


def _nothing_left(report: common.Report, scratch: common.Scratch) -> None:
    report.check(
        "nothing_left",
        label="every job succeeded",
        ok=set(status_counts(scratch)) == {"succeeded"},
        detail=str(status_counts(scratch)),
    )


def measure(
    scratch: common.Scratch, args: argparse.Namespace, env: dict[str, str], report: common.Report
) -> None:
    """Phases 1-4: raw Celery, drain, latency, memory."""
    # Running throughout, raw phases included, so that its polling loads both sides.
    dispatchers = common.start_dispatchers(bench=NAME, env=env)
    raw_before = run_raw(scratch, args, dispatchers)
    drain = create_and_drain(
        scratch,
        bench=NAME,
        env=env,
        jobs=args.jobs,
        owner=bench_user("bench-e2e"),
        queue=JOB_QUEUE,
        concurrency=args.concurrency,
        prefetch=args.prefetch,
        dispatchers=dispatchers,
    )
    raw_after = run_raw(scratch, args, dispatchers)
    raw_per_s = _raw_celery(report, raw_before, raw_after)
    report.extra("jobops_drain", drain)
    _drain_against_raw(
        report,
        "drain",
        label="no-op drain, jobops",
        jobs_per_s=drain["jobs_per_s"],
        raw=raw_per_s,
        target=0.5,
    )
    # Where each side's CPU went in its window: the ratio's explanation, in every run.
    _cpu_figure(report, "drain_cpu_ms_per_job", "drain CPU per job", drain["cpu_ms_per_job"])
    _cpu_figure(
        report, "raw_cpu_ms_per_task", "raw Celery CPU per task", raw_after["cpu_ms_per_task"]
    )
    report.figure("create_per_s", drain["create_per_s"], "jobs/s", "creation through job_create")
    capacity = run_capacity(scratch, args, env, dispatchers)
    report.extra("jobops_capacity", capacity)
    report.figure("capacity_per_s", capacity["jobs_per_s"], "jobs/s", "capacity, submit -> done")
    _cpu_figure(
        report, "capacity_cpu_ms_per_job", "capacity run CPU per job", capacity["cpu_ms_per_job"]
    )
    per_s = args.latency_rate or max(1.0, 0.5 * capacity["jobs_per_s"])
    latency = run_latency(scratch, args, env, per_s, dispatchers)
    for dispatcher in dispatchers.values():
        dispatcher.check_alive()
        dispatcher.stop()
    report.extra("jobops_latency", latency)
    start, done = latency["submit_to_start"], latency["submit_to_done"]
    report.figure("latency_rate", latency["submit_rate_per_s"], "jobs/s", "latency run rate")
    _cpu_figure(
        report, "latency_cpu_ms_per_job", "latency run CPU per job", latency["cpu_ms_per_job"]
    )
    _submit_to_start(report, "", start, target_ms=50)
    report.figure("submit_to_done_p50_ms", done["p50_ms"], "ms", "submit -> done p50")
    report.figure("submit_to_done_p99_ms", done["p99_ms"], "ms", "submit -> done p99")
    rss = max(drain["peak_worker_rss_bytes"], latency["peak_worker_rss_bytes"])
    pss = max(drain["peak_worker_pss_bytes"], latency["peak_worker_pss_bytes"])
    report.figure("peak_worker_rss_mb", round(rss / 2**20, 1), "MiB", "peak worker RSS")
    report.figure("peak_worker_pss_mb", round(pss / 2**20, 1), "MiB", "peak worker PSS")
    _nothing_left(report, scratch)
    report.check(
        "queue_empty",
        label="queue `default` empty at the end",
        ok=common.queue_depth(scratch.broker_url, JOB_QUEUE) == 0,
    )


# --- --executor postgres: the postgres executor's arm (docs/postgres-executor.md) -----------
PG_EXECUTOR = {f"JOBOPS_EXECUTOR_{JOB_QUEUE.upper()}": "postgres"}


def _run_worker(args: argparse.Namespace, env: dict[str, str]) -> common.Service:
    """`manage.py run_worker` on the no-op jobs' queue, once it is live: its first
    liveness beat (jobs.liveness), which it writes once it LISTENs, so that the latency
    run's first job wakes it. (The bench logs at warning level: no start line.)"""
    from jobs.executor import LIVENESS_KIND
    from jobs.liveness import live_processes

    prefetch = {"JOBOPS_WORKER_PREFETCH": str(args.worker_prefetch)} if args.worker_prefetch else {}
    service = common.Service(
        bench=NAME,
        role="run_worker",
        argv=[
            *(sys.executable, str(common.ROOT / "manage.py"), "run_worker"),
            *("--queues", JOB_QUEUE, "--concurrency", str(args.concurrency)),
            *("--pool", args.pool),
        ],
        env={**env, **prefetch},
    )
    service.sample_memory()

    def live() -> bool:
        service.check_alive()
        return any(p["pid"] == service.pid for p in live_processes().get(LIVENESS_KIND, []))

    common.wait_until(live, timeout=60, what="run_worker's first liveness beat")
    return service


def _pg_capacity(
    scratch: common.Scratch, args: argparse.Namespace, env: dict[str, str], owner: Any
) -> dict[str, Any]:
    """The rate the whole path keeps up with, as the Celery arm's capacity: jobs created
    back to back (one submitter) while run_worker runs them; N / (first created -> last
    `succeeded`). The drain leaves creation out: at half the drain rate a submitter can
    outrun what creation alone keeps up with, and the latency run would measure a queue."""
    worker = _run_worker(args, env)
    ids, _seconds = create_jobs(args.jobs, owner=owner)
    wait_then_stop(
        scratch, worker, job_ids=ids, status="succeeded", timeout=900, what="the capacity jobs"
    )
    first = min(created_times(scratch, ids).values())
    last = max(audit_times(scratch, events=("succeeded",), job_ids=ids)["succeeded"].values())
    return {"jobs": len(ids), "jobs_per_s": common.rate(len(ids), last - first)}


def measure_postgres(
    scratch: common.Scratch, args: argparse.Namespace, env: dict[str, str], report: common.Report
) -> None:
    """The postgres executor against raw Celery (prefork, acks late) on the same machine:
    1. no-op drain: N jobs created (they wait `pending`: nothing publishes them), then a
       run_worker with --concurrency workers starts; jobs/s = N / (first `started` ->
       last `succeeded`), with the CPU ms per job of every process in that window;
    2. capacity: jobs created back to back while a run_worker runs them (`_pg_capacity`);
    3. submit -> start and submit -> done p50/p99 at a fixed rate, half that capacity
       unless --latency-rate (the run_worker, the dispatchers and the submitter running).
    Raw Celery before and after, their mean the baseline, as in the Celery arm."""
    env = {**env, **PG_EXECUTOR}
    dispatchers = common.start_dispatchers(bench=NAME, env=env)
    owner = bench_user("bench-e2e")
    raw_before = run_raw(scratch, args, dispatchers)
    ids, create_seconds = create_jobs(args.jobs, owner=owner)
    worker = _run_worker(args, env)
    with common.CpuSampler({"run_worker": worker, **dispatchers}, database=scratch.database) as cpu:
        wait_then_stop(
            scratch,
            worker,
            job_ids=ids,
            status="succeeded",
            timeout=max(300, args.jobs),
            what="the drained jobs",
        )
    drain = drain_rate(scratch, ids)
    drain_cpu = cpu.ms_per_item(drain["first_started_at"], drain["last_succeeded_at"], len(ids))
    raw_after = run_raw(scratch, args, dispatchers)
    capacity = _pg_capacity(scratch, args, env, owner)
    per_s = args.latency_rate or max(1.0, 0.5 * capacity["jobs_per_s"])
    worker = _run_worker(args, env)
    with common.CpuSampler(
        {"run_worker": worker, **dispatchers},
        this_process="submitter",
        database=scratch.database,
    ) as latency_cpu:
        latency_ids, first, last = _submit_at_rate(owner, args.latency_jobs, per_s)
        wait_then_stop(
            scratch,
            worker,
            job_ids=latency_ids,
            status="succeeded",
            timeout=900,
            what="the latency jobs",
        )
    for dispatcher in dispatchers.values():
        dispatcher.check_alive()
        dispatcher.stop()
    to_start, to_done = start_times(scratch, latency_ids)
    start, done = common.latency_summary(to_start), common.latency_summary(to_done)
    raw_per_s = _raw_celery(report, raw_before, raw_after)
    report.extra(
        "postgres_drain",
        {
            **drain,
            "create_per_s": common.rate(len(ids), create_seconds),
            "cpu_ms_per_job": drain_cpu,
        },
    )
    report.extra(
        "postgres_latency",
        {
            "jobs": len(latency_ids),
            "submit_rate_per_s": round(per_s, 1),
            "cpu_ms_per_job": latency_cpu.ms_per_item(first, last, len(latency_ids)),
            "submit_to_start": start,
            "submit_to_done": done,
        },
    )
    _drain_against_raw(
        report,
        "pg_drain",
        label="no-op drain, postgres executor",
        jobs_per_s=drain["jobs_per_s"],
        raw=raw_per_s,
        target=1.0,
    )
    _cpu_figure(report, "pg_drain_cpu_ms_per_job", "drain CPU per job", drain_cpu)
    _cpu_figure(
        report, "raw_cpu_ms_per_task", "raw Celery CPU per task", raw_after["cpu_ms_per_task"]
    )
    report.target(
        "pg_drain_cpu_ms_per_job_total",
        label="drain CPU per job, all processes",
        value=float(drain_cpu["total"]),
        unit="ms",
        target=1.0,
        higher_is_better=False,
    )
    report.extra("postgres_capacity", capacity)
    report.figure("pg_capacity_per_s", capacity["jobs_per_s"], "jobs/s", "capacity, submit -> done")
    report.figure("pg_latency_rate", round(per_s, 1), "jobs/s", "latency run rate")
    _submit_to_start(report, "pg_", start, target_ms=15)
    report.figure("pg_submit_to_done_p99_ms", done["p99_ms"], "ms", "submit -> done p99")
    _nothing_left(report, scratch)


def main() -> int:
    parser = common.parser_for(__doc__)
    parser.add_argument("--jobs", type=int, help="jobs (and raw tasks) drained [2000]")
    parser.add_argument("--latency-jobs", type=int, help="jobs of the latency run [500]")
    parser.add_argument(
        "--latency-rate", type=float, default=0, help="jobs/s (0: half the capacity run's)"
    )
    parser.add_argument("--concurrency", type=int, default=2, help="worker processes")
    parser.add_argument("--prefetch", type=int, default=3, help="prefetch multiplier")
    parser.add_argument("--profile", action="store_true", help="add the profile phase")
    parser.add_argument("--profile-only", action="store_true", help="only the profile phase")
    parser.add_argument("--profile-jobs", type=int, help="jobs of the profile phase [200]")
    parser.add_argument(
        "--executor",
        choices=["celery", "postgres"],
        default="celery",
        help="the jobs' executor: celery (the default path) or postgres (run_worker)",
    )
    parser.add_argument(
        "--pool",
        choices=["threads", "processes"],
        default="threads",
        help="--executor postgres: run_worker's runners (no-op jobs: threads) [threads]",
    )
    parser.add_argument(
        "--worker-prefetch",
        type=int,
        default=0,
        help="--executor postgres: JOBOPS_WORKER_PREFETCH of run_worker [0: its default]",
    )
    args, report = common.prepare(NAME, parser, full=FULL, quick=QUICK)
    with common.Scratch(NAME, keep=args.keep) as scratch:
        scratch.setup_django(JOBOPS_HANDLERS=HANDLERS)
        env = scratch.env(JOBOPS_HANDLERS=HANDLERS)
        if args.executor == "postgres":
            measure_postgres(scratch, args, env, report)
        elif not args.profile_only:
            measure(scratch, args, env, report)
        if args.profile or args.profile_only:
            report.extra("profile", run_profile(scratch, args, report))
        report.write(scratch)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
