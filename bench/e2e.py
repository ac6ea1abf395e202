"""Benchmark: jobops no-op jobs vs raw Celery no-op tasks, same broker and worker settings.

1. Scratch places: a database `<db>_bench_e2e` (dropped, re-created, migrated) and a
   RabbitMQ vhost `<vhost>_bench_e2e` (via rabbitmqctl; falls back to the configured
   vhost when rabbitmqctl is missing) with the topology declared.
2. Raw Celery: N no-op tasks published with confirms to a quorum queue shaped like ours
   (acks_late, reject on worker loss, prefetch and concurrency as jobops, no database,
   results ignored); then a worker is started; tasks/s = N / (first start -> last done),
   timestamps kept in Redis.
3. jobops throughput: N no-op `ai` jobs created through `job_create` (committed,
   published with confirms, `queued`), then a worker is started; jobs/s = N / (first
   `started` -> last `succeeded`, audit timestamps). Each job: claim, heartbeat thread,
   handler, `succeeded`, audit entries and outbox rows, Celery's result row.
4. jobops latency: with the worker running, M jobs submitted at a fixed rate (half the
   measured capacity unless --latency-rate); submit -> start and submit -> done
   p50/p99 from the job's created_at and its audit trail.
5. Peak worker RSS (main process + pool children, sampled from /proc).
6. `--profile`: cProfile of the in-process path (job_create + job_execute) for 300
   jobs, printing where the time goes and the SQL statements per job.
Prints one line per figure and writes bench/results/e2e.json.

Usage: python bench/e2e.py [--jobs 5000] [--latency-jobs 1000] [--concurrency 2]
       [--prefetch 3] [--profile] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "e2e.json"

# --- the raw Celery app (imported by its worker subprocess: no Django) ---------------
from celery import Celery  # noqa: E402
from kombu import Exchange, Queue  # noqa: E402

RAW_QUEUE = "bench_raw"
raw_app = Celery("bench_raw")


def _raw_config() -> dict[str, Any]:
    from jobs.topology import DELIVERY_LIMIT, MAX_LENGTH

    queue = Queue(
        RAW_QUEUE,
        exchange=Exchange("bench.direct", type="direct", durable=True),
        routing_key=RAW_QUEUE,
        durable=True,
        queue_arguments={
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": f"{RAW_QUEUE}.dlx",
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
            "x-delivery-limit": DELIVERY_LIMIT,
            "x-max-length": MAX_LENGTH,
        },
    )
    return {
        "broker_url": os.environ["BROKER_URL"],
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {"confirm_publish": True},
        "task_queues": [queue],
        "task_default_queue": RAW_QUEUE,
        "task_create_missing_queues": False,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": False,
        "task_ignore_result": True,
        "worker_consumer": "config.celery:JobopsConsumer",
        "worker_hijack_root_logger": False,
    }


raw_app.add_defaults(_raw_config)


@raw_app.task(name="bench.noop")
def raw_noop(i: int) -> None:
    import redis

    r = redis.Redis.from_url(os.environ["REDIS_URL"])
    now = repr(time.time())
    r.set("bench:e2e:first", now, nx=True)
    r.set("bench:e2e:last", now)
    r.incr("bench:e2e:done")


def noop_handler(ctx: Any, params: dict[str, Any]) -> None:
    """The jobops no-op handler (wired with JOBOPS_HANDLERS in the worker)."""
    return None


# --- scratch database and vhost -----------------------------------------------------
def scratch_env() -> dict[str, str]:
    from config.env import env_str

    db = urlparse(env_str("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/jobops"))
    db_name = db.path.lstrip("/") + "_bench_e2e"
    broker = urlparse(env_str("BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"))
    vhost = broker.path[1:] or "/"
    bench_vhost = ("jobops" if vhost == "/" else vhost) + "_bench_e2e"
    if shutil.which("rabbitmqctl"):
        subprocess.run(["rabbitmqctl", "-q", "add_vhost", bench_vhost], capture_output=True)
        user = broker.username or "guest"
        subprocess.run(
            ["rabbitmqctl", "-q", "set_permissions", "-p", bench_vhost, user, ".*", ".*", ".*"],
            check=True,
            capture_output=True,
        )
        from urllib.parse import quote

        broker = broker._replace(path="/" + quote(bench_vhost, safe=""))
    else:
        print("rabbitmqctl not found: using the configured vhost", file=sys.stderr)
    return {
        **os.environ,
        "DATABASE_URL": urlunparse(db._replace(path="/" + db_name)),
        "BROKER_URL": urlunparse(broker),
        "DJANGO_SETTINGS_MODULE": "config.settings",
        # Production mode: DEBUG on records every SQL statement (time and memory).
        "DEBUG": "false",
        # Plain HTTP on localhost, as the postgres superuser: accepted here knowingly.
        "SECURE_SSL_REDIRECT": "false",
        "JOBOPS_DB_ALLOW_PRIVILEGED": "true",
        "SECRET_KEY": secrets.token_urlsafe(48),
        "AUDIT_SIGNING_KEY": secrets.token_urlsafe(48),
        "METRICS_TOKEN": secrets.token_urlsafe(24),
        "ALLOWED_HOSTS": "localhost",
        "LOG_LEVEL": "WARNING",
        "JOBOPS_HANDLERS": json.dumps({"ai": "bench.e2e.noop_handler"}),
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
    }


def manage(env: dict[str, str], *args: str) -> None:
    subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True, capture_output=True
    )


def prepare(env: dict[str, str]) -> None:
    import psycopg

    url = urlparse(env["DATABASE_URL"])
    name = url.path.lstrip("/")
    admin = urlunparse(url._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    manage(env, "migrate", "--noinput")
    manage(env, "setup_topology")


# --- workers --------------------------------------------------------------------------
class Worker:
    def __init__(self, env: dict[str, str], app: str, queues: str, args: argparse.Namespace):
        self.log = Path(f"/tmp/jobops-bench-e2e-{uuid.uuid4().hex[:6]}.log")
        cmd = [sys.executable, "-m", "celery", "-A", app, "worker", "-Q", queues]
        cmd += ["-c", str(args.concurrency), "--prefetch-multiplier", str(args.prefetch)]
        cmd += ["-l", "warning", "--without-gossip", "--without-mingle", "-n", f"{app}@%h"]
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.peak_rss = self.peak_pss = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _pids(self) -> list[int]:
        pids, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            pids.append(pid)
            try:
                for task in Path(f"/proc/{pid}/task").iterdir():
                    todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
        return pids

    def memory(self) -> tuple[int, int]:
        """(RSS, PSS) summed over the worker's processes. RSS counts the pages the pool
        children share with their parent once per process; PSS splits them."""
        rss = pss = 0
        for pid in self._pids():
            try:
                for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
            except OSError:
                pass
        return rss, pss

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            rss, pss = self.memory()
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)

    def stop(self) -> None:
        self._stop.set()
        os.killpg(self.proc.pid, 15)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)


def consumers(env: dict[str, str], queue: str) -> int:
    from kombu import Connection

    with Connection(env["BROKER_URL"]) as conn:
        return conn.default_channel.queue_declare(queue, passive=True).consumer_count


def wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


# --- phases ---------------------------------------------------------------------------
def run_raw(env: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    import redis
    from django.conf import settings

    r = redis.Redis.from_url(settings.REDIS_URL)
    r.delete("bench:e2e:first", "bench:e2e:last", "bench:e2e:done")
    raw_app.conf.broker_url = env["BROKER_URL"]
    with raw_app.connection_for_write() as conn:
        queue = raw_app.conf.task_queues[0]
        queue(conn.default_channel).declare()
        queue(conn.default_channel).purge()
        with raw_app.producer_or_acquire() as producer:
            for i in range(args.jobs):
                raw_noop.apply_async(args=[i], producer=producer)
    raw_env = {**env, "PYTHONPATH": f"{ROOT / 'bench'}:{ROOT}", "REDIS_URL": settings.REDIS_URL}
    raw_env.pop("DJANGO_SETTINGS_MODULE")  # no Django, no database in the raw worker
    worker = Worker(raw_env, "e2e:raw_app", RAW_QUEUE, args)
    try:
        wait(lambda: int(r.get("bench:e2e:done") or 0) >= args.jobs, 600, "raw tasks")
    finally:
        worker.stop()
    elapsed = float(r.get("bench:e2e:last")) - float(r.get("bench:e2e:first"))
    return {"tasks": args.jobs, "seconds": elapsed, "tasks_per_s": args.jobs / elapsed}


def _owner() -> Any:
    from django.contrib.auth import get_user_model

    user, _ = get_user_model().objects.get_or_create(username="bench-e2e")
    return user


def _create_jobs(n: int) -> list[Any]:
    from jobs.services import job_create

    owner = _owner()
    return [job_create(owner=owner, job_type="ai", params={"text": "x"})[0].id for _ in range(n)]


def _stamps(event: str) -> dict[Any, float]:
    from audit.models import AuditLog

    rows = AuditLog.objects.filter(event_type=event).values_list("job_id", "ts")
    return {job_id: ts.timestamp() for job_id, ts in rows}


def _succeeded() -> int:
    from jobs.models import Job

    return Job.objects.filter(status="succeeded").count()


def run_jobops_throughput(env: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    from jobs.models import Job

    t0 = time.monotonic()
    _create_jobs(args.jobs)
    submit_seconds = time.monotonic() - t0
    queued = Job.objects.filter(status="queued").count()
    worker = Worker(env, "config", "default", args)
    try:
        wait(lambda: _succeeded() >= args.jobs, 900, "jobops jobs")
    finally:
        worker.stop()
    started, done = _stamps("started"), _stamps("succeeded")
    elapsed = max(done.values()) - min(started.values())
    return {
        "jobs": args.jobs,
        "queued_on_confirm": queued,
        "submit_seconds": submit_seconds,
        "submit_per_s": args.jobs / submit_seconds,
        "seconds": elapsed,
        "jobs_per_s": args.jobs / elapsed,
        "peak_worker_rss_bytes": worker.peak_rss,
        "peak_worker_pss_bytes": worker.peak_pss,
    }


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def run_jobops_latency(
    env: dict[str, str], args: argparse.Namespace, rate: float
) -> dict[str, Any]:
    from audit.models import AuditLog
    from jobs.models import Job

    before = _succeeded()
    worker = Worker(env, "config", "default", args)
    try:
        wait(lambda: consumers(env, "default") > 0, 60, "the worker to consume")
        # Open loop at a fixed rate below capacity, so that the figures are the
        # pipeline's latency, not the wait in a queue that a saturating submitter builds.
        from jobs.services import job_create

        owner, ids, interval = _owner(), [], 1.0 / rate
        next_at = time.monotonic()
        for _ in range(args.latency_jobs):
            next_at += interval
            ids.append(job_create(owner=owner, job_type="ai", params={"text": "x"})[0].id)
            time.sleep(max(0.0, next_at - time.monotonic()))
        wait(lambda: _succeeded() >= before + args.latency_jobs, 600, "latency jobs")
    finally:
        worker.stop()
    created = dict(Job.objects.filter(id__in=ids).values_list("id", "created_at"))
    rows = AuditLog.objects.filter(job_id__in=ids, event_type__in=["started", "succeeded"])
    start, done = {}, {}
    for job_id, event, ts in rows.values_list("job_id", "event_type", "ts"):
        (start if event == "started" else done)[job_id] = ts.timestamp()
    to_start = [(start[j] - created[j].timestamp()) * 1000 for j in ids]
    to_done = [(done[j] - created[j].timestamp()) * 1000 for j in ids]
    return {
        "jobs": len(ids),
        "submit_to_start_ms_p50": _pct(to_start, 50),
        "submit_to_start_ms_p99": _pct(to_start, 99),
        "submit_to_done_ms_p50": _pct(to_done, 50),
        "submit_to_done_ms_p99": _pct(to_done, 99),
        "submit_to_done_ms_mean": statistics.fmean(to_done),
        "submit_rate_per_s": rate,
        "peak_worker_rss_bytes": worker.peak_rss,
        "peak_worker_pss_bytes": worker.peak_pss,
    }


def run_profile(n: int = 300) -> dict[str, Any]:
    """cProfile of create + execute in process; counts SQL statements per job."""
    import cProfile
    import io
    import pstats

    from django.db import connection

    from jobs.models import Job
    from jobs.publisher import wire_payload
    from jobs.runtime import job_execute

    statements = {"n": 0}

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements["n"] += 1
        return execute(sql, params, many, context)

    profiler = cProfile.Profile()
    with connection.execute_wrapper(count):
        profiler.enable()
        t0 = time.perf_counter()
        ids = _create_jobs(n)
        create_s = time.perf_counter() - t0
        create_sql = statements["n"]
        t1 = time.perf_counter()
        for job in Job.objects.filter(id__in=ids):
            job_execute(payload=wire_payload(job), hostname="profile")
        execute_s = time.perf_counter() - t1
        profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(12)
    print(out.getvalue())
    return {
        "jobs": n,
        "create_ms_per_job": create_s / n * 1000,
        "execute_ms_per_job": execute_s / n * 1000,
        "sql_per_job_create": create_sql / n,
        "sql_per_job_execute": (statements["n"] - create_sql) / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--latency-jobs", type=int, default=1000)
    parser.add_argument("--latency-rate", type=float, default=0, help="jobs/s (0: half capacity)")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--prefetch", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args()

    env = scratch_env()
    prepare(env)
    os.environ.update(env)
    import django

    django.setup()
    # Raw Celery runs before and after jobops and the ratio uses their mean, so that a
    # change in machine load during the run does not favour either side.
    raw_before = run_raw(env, args)
    print(f"raw celery no-op (before): {raw_before['tasks_per_s']:.0f} tasks/s")
    tp = run_jobops_throughput(env, args)
    print(f"jobops no-op: {tp['jobs_per_s']:.0f} jobs/s ({tp['jobs']} jobs)")
    raw_after = run_raw(env, args)
    print(f"raw celery no-op (after): {raw_after['tasks_per_s']:.0f} tasks/s")
    raw = {
        "tasks": args.jobs,
        "tasks_per_s": (raw_before["tasks_per_s"] + raw_after["tasks_per_s"]) / 2,
        "before": raw_before,
        "after": raw_after,
    }
    print(f"raw celery no-op: {raw['tasks_per_s']:.0f} tasks/s ({raw['tasks']} tasks, mean)")
    print(f"jobops submit (job_create + confirmed publish): {tp['submit_per_s']:.0f} jobs/s")
    rate = args.latency_rate or max(1.0, 0.5 * min(tp["jobs_per_s"], tp["submit_per_s"]))
    lat = run_jobops_latency(env, args, rate)
    print(f"latency run: {lat['jobs']} jobs submitted at {rate:.0f}/s (half of capacity)")
    print(f"submit->start p50: {lat['submit_to_start_ms_p50']:.1f} ms")
    print(f"submit->start p99: {lat['submit_to_start_ms_p99']:.1f} ms")
    print(f"submit->done p50: {lat['submit_to_done_ms_p50']:.1f} ms")
    print(f"submit->done p99: {lat['submit_to_done_ms_p99']:.1f} ms")
    peak = max(tp["peak_worker_rss_bytes"], lat["peak_worker_rss_bytes"])
    pss = max(tp["peak_worker_pss_bytes"], lat["peak_worker_pss_bytes"])
    print(
        f"peak worker RSS (main + {args.concurrency} children): {peak / 2**20:.0f} MiB "
        f"(PSS {pss / 2**20:.0f} MiB)"
    )
    ratio = tp["jobs_per_s"] / raw["tasks_per_s"]
    print(f"ratio jobops/raw: {ratio:.2f} (target >= 0.5)")
    result: dict[str, Any] = {
        "settings": {
            "concurrency": args.concurrency,
            "prefetch_multiplier": args.prefetch,
            "acks_late": True,
            "queue": "quorum",
        },
        "raw_celery": raw,
        "jobops_throughput": tp,
        "jobops_latency": lat,
        "peak_worker_rss_bytes": peak,
        "peak_worker_pss_bytes": pss,
        "ratio": ratio,
        "load_average_at_end": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    if args.profile:
        result["profile"] = run_profile()
        p = result["profile"]
        print(
            f"profile: {p['sql_per_job_create']:.1f} SQL/job create, "
            f"{p['sql_per_job_execute']:.1f} SQL/job execute, "
            f"{p['execute_ms_per_job']:.2f} ms/job execute in process"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written {RESULTS.relative_to(ROOT)}")
    if not args.keep:
        from django.db import connection

        connection.close()


if __name__ == "__main__":
    main()
