"""Benchmark: jobops' two executors beside their peers, in one run (docs/benchmarks.md).

Five arms, each a worker group of 2 processes on the same machine, services and
scratch places (database and vhost `jobops_bench_executors`), and a sixth of creates:

- `raw`: raw Celery no-op tasks (bench/_raw_celery.py: quorum queue, confirms, prefork
  2, acks late, no database), the floor of the broker path;
- `celery`: jobops, the Celery path (queue `default`, the dispatchers as the Procfile
  starts them, and its worker as the Procfile's light group: `--celery-pool threads`,
  one process of `--celery-concurrency` 8 threads whose ends share transactions; or
  `--celery-pool prefork`, a prefork worker of 2, each end written alone);
- `postgres`: jobops, the PostgreSQL executor (JOBOPS_EXECUTOR_DEFAULT=postgres,
  `manage.py run_worker --queues default --concurrency 2 --pool threads`, or
  `--pool processes`, the same dispatchers);
- `results`: Celery + django-celery-results (bench/_celery_results.py: each task's
  STARTED and SUCCESS rows in PostgreSQL, otherwise the raw arm's settings);
- `procrastinate`: Procrastinate (bench/_procrastinate.py), 2 processes x concurrency 2;
- `batch`: jobs created through the API, no worker running (phase_batch): the single
  `POST /api/v1/jobs` and `POST /api/v1/jobs/batch` of --batch-size (1,000) jobs, a new
  idempotency key each, on one gunicorn with the dispatchers running (bench/_http.py,
  as bench/api.py drives them): jobs/s, CPU ms per job of each process, their ratio;
  then Procrastinate's own `defer` and `batch_defer` jobs/s as context.

Each arm measures, in a process of its own (so that each jobops arm loads its own
settings):
1. drain: N no-op jobs submitted, then the workers started; jobs/s from the first
   start to the last end, read from each system's own record (jobops' audit trail,
   the taskresult rows, procrastinate_events; raw Celery stamps Redis);
2. the same with 10 ms jobs (10 ms of waiting, no CPU);
3. CPU ms per job of each process in the no-op drain's window (CpuSampler of
   bench/_common.py: the workers, the dispatchers for the jobops arms, and the
   PostgreSQL, RabbitMQ and Redis servers by name, whichever arm uses them);
4. capacity: jobs submitted back to back while the workers run (submit -> last end);
5. submit -> start p50/p99 with jobs submitted at half that capacity (open loop).
All arms run --repeat times (their order rotated each round); each figure is the
median of its rounds. Then --seed finished jobs are added to the `jobs` table with
one INSERT ... SELECT over generate_series (rows cloned from a `succeeded` job the
runs made, under new time-ordered ids and older timestamps; no audit rows, no
outbox rows: bench/scale.py measures those), and both jobops arms drain again
--repeat times: the ratio to the empty table's drain. The batch arm's rounds come
last of all: the jobs it creates stay in the table, queued, never run, and would be
the background of any drain after them.

Prints the issue's target table and each arm's figures; writes
bench/results/executors.json. The postgres arm runs only where `manage.py
run_worker` exists; otherwise its rows say "not measured".

Usage: python bench/executors.py [--jobs 2000] [--slow-jobs 1000] [--capacity-jobs 1000]
       [--latency-jobs 2000] [--seed 1000000] [--repeat 3] [--arms raw,celery,...]
       [--pool threads|processes] [--celery-pool threads|prefork] [--celery-concurrency N]
       [--api-seconds 8] [--batch-size 1000] [--quick] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as common
from bench import _http as http
from bench._jobflow import job_to_clone

NAME = "executors"
# `make bench` takes about 20 min on 2 busy cores with these; --quick about 3 min.
FULL = {
    "jobs": 2000,
    "slow_jobs": 1000,
    "capacity_jobs": 1000,
    # The p99 at half capacity from 2,000 samples a round (issue 39).
    "latency_jobs": 2000,
    "seed": 1_000_000,
    "repeat": 3,
    # Each create figure of the batch arm, after its 1 s warm-up (bench/api.py's).
    "api_seconds": 8.0,
}
QUICK = {
    "jobs": 200,
    "slow_jobs": 100,
    "capacity_jobs": 200,
    "latency_jobs": 100,
    "seed": 20_000,
    "repeat": 1,
    "api_seconds": 2.0,
}
BATCH = "batch"
ARMS = ("raw", "celery", "postgres", "results", "procrastinate", BATCH)
LABELS = {
    "raw": "raw Celery",
    "celery": "jobops, Celery path",
    "postgres": "jobops, postgres executor",
    "results": "Celery + django-celery-results",
    "procrastinate": "Procrastinate",
    BATCH: "batch create through the API",
}
JOBOPS_ARMS = ("celery", "postgres")
CONCURRENCY, PREFETCH = 2, 3
# The jobops Celery arm's worker (--celery-pool, --celery-concurrency): the Procfile's
# light group by default.
CELERY_POOL = {"pool": "threads", "concurrency": 0}
CELERY_CONCURRENCY = {"threads": 8, "prefork": CONCURRENCY}
JOB_TYPE, JOB_QUEUE, PARAMS = "ai", "default", {"text": "x"}
HANDLERS = {
    "noop": json.dumps({JOB_TYPE: "bench._handlers.noop"}),
    "sleep10": json.dumps({JOB_TYPE: "bench._handlers.sleep_10ms"}),
}
RUN_WORKER = common.ROOT / "jobs" / "management" / "commands" / "run_worker.py"
# Columns of the seeded jobs that must differ from the template's (a finished job the
# runs made); every other column is cloned as it is, whatever columns the app has.
# The ids are UUIDv7-shaped from the row's own (older) created_at, as the app's are.
SEED_OVERRIDES = {
    "id": (
        "(lpad(to_hex((extract(epoch FROM now() - s.n * interval '2.5 seconds') * 1000)"
        "::bigint), 12, '0') || '7' || substr(md5(s.n::text), 1, 3) || '8' "
        "|| substr(md5(s.n::text), 4, 15))::uuid"
    ),
    "created_at": "now() - s.n * interval '2.5 seconds'",
    "updated_at": "now() - s.n * interval '2.5 seconds' + interval '1 second'",
    "idempotency_key": "NULL",
    "idempotency_expires_at": "NULL",
    "idempotency_last_seen_at": "NULL",
    "request_id": "NULL",
    "correlation_id": "NULL",
    "rerun_of_id": "NULL",
}


# --- arms (each runs in a child process: python bench/executors.py --child ARM) ---------
class ServiceGroup:
    """Several worker processes under one role, as CpuSampler and stop() see them."""

    def __init__(self, services: list[common.Service]) -> None:
        self.services = services

    def pids(self) -> list[int]:
        return [pid for service in self.services for pid in service.pids()]

    def check_alive(self) -> None:
        for service in self.services:
            service.check_alive()

    def stop(self) -> None:
        for service in self.services:
            service.stop()


class Arm:
    """What each system provides to the phases below. Ids are strings of its own."""

    def __init__(self, scratch: common.Scratch) -> None:
        self.scratch = scratch

    def services(self) -> dict[str, Any]:
        """Processes that run throughout (the dispatchers), by role."""
        return {}

    def reset(self) -> None:
        """Forget the counts of an earlier phase (no worker is running)."""

    def submit_batch(self, kind: str, n: int) -> list[str]:
        raise NotImplementedError

    def submit_one(self, kind: str) -> str:
        raise NotImplementedError

    def start_workers(self, kind: str) -> Any:
        raise NotImplementedError

    def done_count(self, ids: list[str]) -> int:
        raise NotImplementedError

    def drain_window(self, ids: list[str]) -> tuple[float, float]:
        """Epoch seconds of the first start and the last end of these jobs."""
        raise NotImplementedError

    def capacity_window(self, ids: list[str]) -> tuple[float, float]:
        """Epoch seconds of the first submit and the last end of these jobs."""
        raise NotImplementedError

    def submit_to_start(self, ids: list[str]) -> list[float]:
        raise NotImplementedError

    def close(self) -> None:
        """Stop what the arm started."""

    def wait_done(self, ids: list[str], workers: Any) -> None:
        def done() -> bool:
            workers.check_alive()
            for service in self.services().values():
                service.check_alive()
            return self.done_count(ids) >= len(ids)

        common.wait_until(
            done, timeout=max(300, len(ids)), what=f"{len(ids)} jobs to finish", interval=0.25
        )


def _plain_celery_worker(env: dict[str, str], app: Any, *, role: str) -> Any:
    """A worker of one of the plain Celery apps (bench._raw_celery, bench._celery_results)
    on its queue, with the concurrency and prefetch every arm gets."""
    return common.start_worker(
        bench=NAME,
        env=env,
        queues=app.QUEUE,
        app=app.__name__,
        concurrency=CONCURRENCY,
        prefetch=PREFETCH,
        role=role,
    )


class RawArm(Arm):
    def __init__(self, scratch: common.Scratch) -> None:
        import redis

        from bench import _raw_celery

        super().__init__(scratch)
        self.raw = _raw_celery
        self.raw.app.conf.broker_url = scratch.broker_url
        self.key = f"{scratch.redis_prefix}:raw"
        self.redis = redis.Redis.from_url(scratch.redis_url)
        self.env = scratch.env(BENCH_RAW_KEY=self.key)
        self.tasks = {"noop": self.raw.noop, "sleep10": self.raw.sleep10}
        self.submitted: dict[str, float] = {}
        self.next = 0
        self.raw.declare_and_purge()
        self._producer_cm = self.raw.app.producer_or_acquire()
        self.producer = self._producer_cm.__enter__()

    def reset(self) -> None:
        self.redis.delete(*(f"{self.key}:{k}" for k in ("first", "last", "done", "start")))

    def _send(self, kind: str, timed: bool) -> str:
        self.next += 1
        self.submitted[str(self.next)] = time.time()
        self.tasks[kind].apply_async(args=[self.next, timed], producer=self.producer)
        return str(self.next)

    def submit_batch(self, kind: str, n: int) -> list[str]:
        return [self._send(kind, False) for _ in range(n)]

    def submit_one(self, kind: str) -> str:
        return self._send(kind, True)

    def start_workers(self, kind: str) -> Any:
        return _plain_celery_worker(self.env, self.raw, role="raw-worker")

    def done_count(self, ids: list[str]) -> int:
        return int(self.redis.get(f"{self.key}:done") or 0)

    def drain_window(self, ids: list[str]) -> tuple[float, float]:
        return float(self.redis.get(f"{self.key}:first") or 0), float(
            self.redis.get(f"{self.key}:last") or 0
        )

    def capacity_window(self, ids: list[str]) -> tuple[float, float]:
        return min(self.submitted[i] for i in ids), float(self.redis.get(f"{self.key}:last") or 0)

    def submit_to_start(self, ids: list[str]) -> list[float]:
        started = {k.decode(): float(v) for k, v in self.redis.hgetall(f"{self.key}:start").items()}
        return [(started[i] - self.submitted[i]) * 1000 for i in ids]

    def close(self) -> None:
        self._producer_cm.__exit__(None, None, None)
        self.redis.close()


class JobopsArm(Arm):
    """jobops through its own doors: `job_create`, the dispatchers, a worker group."""

    def __init__(self, scratch: common.Scratch, executor: str, pool: str = "threads") -> None:
        from bench._jobflow import bench_user

        super().__init__(scratch)
        self.executor = executor
        self.pool = pool
        self.envs = {kind: scratch.env(JOBOPS_HANDLERS=h) for kind, h in HANDLERS.items()}
        self.owner = bench_user("bench-executors")
        self.dispatchers = common.start_dispatchers(bench=NAME, env=self.envs["noop"])

    def services(self) -> dict[str, Any]:
        return self.dispatchers

    def submit_batch(self, kind: str, n: int) -> list[str]:
        from bench._jobflow import create_jobs, wait_for_status

        ids, _seconds = create_jobs(n, owner=self.owner, threads=2)
        if self.executor == "celery":
            # The drain measures the workers, not the publishing.
            wait_for_status(
                self.scratch,
                count=n,
                statuses=("queued",),
                job_ids=ids,
                timeout=600,
                what="every job to be published (queued)",
            )
        return ids

    def submit_one(self, kind: str) -> str:
        from jobs.services import job_create

        job, _created = job_create(owner=self.owner, job_type=JOB_TYPE, params=PARAMS)
        return str(job.id)

    def start_workers(self, kind: str) -> Any:
        env = self.envs[kind]
        if self.executor == "celery":
            pool = str(CELERY_POOL["pool"])
            return common.start_worker(
                bench=NAME,
                env=env,
                queues=JOB_QUEUE,
                concurrency=int(CELERY_POOL["concurrency"]) or CELERY_CONCURRENCY[pool],
                prefetch=PREFETCH,
                pool=pool,
            )
        return common.Service(
            bench=NAME,
            role="pg-worker",
            argv=[
                *(sys.executable, str(common.ROOT / "manage.py"), "run_worker"),
                *("--queues", JOB_QUEUE, "--concurrency", str(CONCURRENCY)),
                # No-op and 10 ms jobs are what JOBOPS_WORKER_POOL=threads is for
                # (docs/postgres-executor.md), the default here; --pool processes
                # measures the other pool (run_worker's own default).
                *("--pool", self.pool),
            ],
            env=env,
        )

    def done_count(self, ids: list[str]) -> int:
        from bench._jobflow import status_counts

        return status_counts(self.scratch, ids).get("succeeded", 0)

    def drain_window(self, ids: list[str]) -> tuple[float, float]:
        from bench._jobflow import drain_rate

        drain = drain_rate(self.scratch, ids)
        return drain["first_started_at"], drain["last_succeeded_at"]

    def capacity_window(self, ids: list[str]) -> tuple[float, float]:
        from bench._jobflow import audit_times, created_times

        done = audit_times(self.scratch, events=("succeeded",), job_ids=ids)["succeeded"]
        return min(created_times(self.scratch, ids).values()), max(done.values())

    def submit_to_start(self, ids: list[str]) -> list[float]:
        from bench._jobflow import start_times

        return start_times(self.scratch, ids)[0]

    def close(self) -> None:
        for dispatcher in self.dispatchers.values():
            dispatcher.check_alive()
            dispatcher.stop()


class ResultsArm(Arm):
    def __init__(self, scratch: common.Scratch) -> None:
        from bench import _celery_results

        super().__init__(scratch)
        self.mod = _celery_results
        self.mod.app.conf.broker_url = scratch.broker_url
        self.env = scratch.env(DJANGO_SETTINGS_MODULE=_celery_results.SETTINGS)
        self.mod.declare_and_purge()
        self.publisher = self.mod.Publisher().__enter__()

    def reset(self) -> None:
        with self.scratch.connect() as conn:
            conn.execute(f"DELETE FROM {self.mod.TABLE}")  # type: ignore[arg-type]

    def submit_batch(self, kind: str, n: int) -> list[str]:
        return [self.publisher.submit(kind) for _ in range(n)]

    def submit_one(self, kind: str) -> str:
        return self.publisher.submit(kind)

    def start_workers(self, kind: str) -> Any:
        return _plain_celery_worker(self.env, self.mod, role="results-worker")

    def _rows(self, ids: list[str]) -> list[tuple[str, float, float]]:
        with self.scratch.connect() as conn:
            return conn.execute(
                "SELECT task_id, extract(epoch FROM date_started)::float8, "  # type: ignore[arg-type]
                f"extract(epoch FROM date_done)::float8 FROM {self.mod.TABLE} "
                "WHERE status = 'SUCCESS' AND task_id = ANY(%s)",
                [ids],
            ).fetchall()

    def done_count(self, ids: list[str]) -> int:
        with self.scratch.connect() as conn:
            row = conn.execute(
                f"SELECT count(*) FROM {self.mod.TABLE} "  # type: ignore[arg-type]
                "WHERE status = 'SUCCESS' AND task_id = ANY(%s)",
                [ids],
            ).fetchone()
        return int(row[0])

    def drain_window(self, ids: list[str]) -> tuple[float, float]:
        rows = self._rows(ids)
        return min(r[1] for r in rows), max(r[2] for r in rows)

    def capacity_window(self, ids: list[str]) -> tuple[float, float]:
        rows = self._rows(ids)
        return min(self.publisher.submitted[i] for i in ids), max(r[2] for r in rows)

    def submit_to_start(self, ids: list[str]) -> list[float]:
        return [(r[1] - self.publisher.submitted[r[0]]) * 1000 for r in self._rows(ids)]

    def close(self) -> None:
        self.publisher.__exit__(None, None, None)


class ProcrastinateArm(Arm):
    def __init__(self, scratch: common.Scratch) -> None:
        from bench import _procrastinate

        super().__init__(scratch)
        self.mod = _procrastinate
        self.mod.app.open()

    def submit_batch(self, kind: str, n: int) -> list[str]:
        return [str(i) for i in self.mod.defer_many(kind, n)]

    def submit_one(self, kind: str) -> str:
        return str(self.mod.defer_one(kind))

    def start_workers(self, kind: str) -> Any:
        return ServiceGroup(
            [
                common.Service(
                    bench=NAME,
                    role=f"procrastinate-{n}",
                    argv=self.mod.worker_argv(CONCURRENCY),
                    env=self.scratch.env(),
                )
                for n in (1, 2)
            ]
        )

    def _events(self, ids: list[str]) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {"deferred": {}, "started": {}, "succeeded": {}}
        with self.scratch.connect() as conn:
            for job_id, event, at in conn.execute(
                "SELECT job_id::text, type::text, extract(epoch FROM at)::float8 "
                "FROM procrastinate_events WHERE job_id = ANY(%s::bigint[]) "
                "AND type IN ('deferred', 'started', 'succeeded')",
                [ids],
            ):
                out[event][job_id] = float(at)
        return out

    def done_count(self, ids: list[str]) -> int:
        with self.scratch.connect() as conn:
            row = conn.execute(
                "SELECT count(*) FROM procrastinate_jobs "
                "WHERE id = ANY(%s::bigint[]) AND status = 'succeeded'",
                [ids],
            ).fetchone()
        return int(row[0])

    def drain_window(self, ids: list[str]) -> tuple[float, float]:
        events = self._events(ids)
        return min(events["started"].values()), max(events["succeeded"].values())

    def capacity_window(self, ids: list[str]) -> tuple[float, float]:
        events = self._events(ids)
        return min(events["deferred"].values()), max(events["succeeded"].values())

    def submit_to_start(self, ids: list[str]) -> list[float]:
        events = self._events(ids)
        return [(events["started"][i] - events["deferred"][i]) * 1000 for i in ids]

    def close(self) -> None:
        self.mod.app.close()


def make_arm(name: str, scratch: common.Scratch, pool: str = "threads") -> Arm:
    if name == "raw":
        return RawArm(scratch)
    if name in JOBOPS_ARMS:
        return JobopsArm(scratch, name, pool)
    if name == "results":
        return ResultsArm(scratch)
    if name == "procrastinate":
        return ProcrastinateArm(scratch)
    raise common.BenchError(f"unknown arm {name!r}")


# --- phases ------------------------------------------------------------------------------
def sampler(arm: Arm, workers: Any, this_process: str | None = None) -> common.CpuSampler:
    """The CPU of the arm's processes and of the servers; of PostgreSQL only what serves
    the scratch database (and the server's own processes), not another run's tests."""
    return common.CpuSampler(
        {"worker": workers, **arm.services()},
        this_process=this_process,
        database=arm.scratch.database,
    )


def phase_drain(arm: Arm, kind: str, n: int) -> dict[str, Any]:
    """`n` jobs submitted while no worker runs, then the workers started."""
    arm.reset()
    ids = arm.submit_batch(kind, n)
    workers = arm.start_workers(kind)
    with sampler(arm, workers) as cpu:
        try:
            arm.wait_done(ids, workers)
        finally:
            workers.stop()
    first, last = arm.drain_window(ids)
    return {
        "jobs": n,
        "seconds": round(last - first, 3),
        "jobs_per_s": common.rate(n, last - first),
        "cpu_ms_per_job": cpu.ms_per_item(first, last, n),
    }


def phase_live(arm: Arm, capacity_jobs: int, latency_jobs: int) -> dict[str, Any]:
    """Capacity (submitted back to back while the workers run), then submit -> start at
    half of it (open loop), on the same warmed-up workers."""
    workers = arm.start_workers("noop")
    try:
        arm.reset()
        arm.wait_done([arm.submit_one("noop") for _ in range(5)], workers)  # warm-up
        arm.reset()
        with sampler(arm, workers, this_process="submitter") as cpu:
            ids = [arm.submit_one("noop") for _ in range(capacity_jobs)]
            arm.wait_done(ids, workers)
        first, last = arm.capacity_window(ids)
        capacity = {
            "jobs": capacity_jobs,
            "jobs_per_s": common.rate(capacity_jobs, last - first),
            "cpu_ms_per_job": cpu.ms_per_item(first, last, capacity_jobs),
        }
        arm.reset()
        per_s = max(1.0, 0.5 * capacity["jobs_per_s"])
        interval, next_at, ids = 1.0 / per_s, time.monotonic(), []
        with sampler(arm, workers, this_process="submitter") as cpu:
            began = time.time()
            for _ in range(latency_jobs):
                next_at += interval
                ids.append(arm.submit_one("noop"))
                time.sleep(max(0.0, next_at - time.monotonic()))
            ended = time.time()
            arm.wait_done(ids, workers)
        latency = {
            "jobs": latency_jobs,
            "submit_rate_per_s": round(per_s, 1),
            "cpu_ms_per_job": cpu.ms_per_item(began, ended, latency_jobs),
            "submit_to_start": common.latency_summary(arm.submit_to_start(ids)),
        }
    finally:
        workers.stop()
    return {"capacity": capacity, "latency": latency}


def phase_batch(scratch: common.Scratch, *, seconds: float, size: int) -> dict[str, Any]:
    """Jobs created through the API one per request and `size` per request, then
    Procrastinate's own defer and batch defer as context. No worker runs.

    1. The dispatchers as the Procfile starts them and one gunicorn (bench/api.py's:
       4 sync workers); a user with a token.
    2. `POST /api/v1/jobs` from 16 client threads, then `POST /api/v1/jobs/batch` of
       `size` jobs from 4, a new idempotency key per job (bench/_http.py), each for
       `seconds` after a 1 s warm-up: jobs/s, and the CPU ms per job of each process
       as bench/api.py charges it (gunicorn, the dispatchers, PostgreSQL's backends of
       the scratch database and its own processes, RabbitMQ, Redis; the client's left
       out, its own figure).
    3. Wait until the publisher has published every job made (`queued`), so that none
       is left for the next arm's dispatchers to publish in its window; count the jobs
       in the table against the answers (a 201 is one job, a 200 `size`); stop gunicorn
       and the dispatchers; purge the jobs' queue (no worker ever consumes it).
    4. Procrastinate's `defer` from 16 coroutines and `batch_defer` of `size` from 4
       (bench/_procrastinate.py), `seconds` each after a warm-up: jobs/s and the CPU ms
       per job of this process (its client and its library at once) and PostgreSQL's.
    """
    from bench._jobflow import bench_user, user_token

    owner = bench_user("bench-executors-api")
    before = _owned(scratch, owner.pk)  # an earlier round's jobs (the same user)
    auth = {"Authorization": f"Token {user_token(owner)}"}
    env = scratch.env()
    roles: dict[str, Any] = dict(common.start_dispatchers(bench=NAME, env=env))
    try:
        roles["gunicorn"], base = common.start_gunicorn(
            bench=NAME, env=env, workers=http.WEB_WORKERS, probe="/api/v1/jobs", headers=auth
        )
        with common.CpuSampler(roles, database=scratch.database) as cpu:
            single = http.closed_loop(
                cpu,
                {**http.create_spec(base), "headers": auth, "concurrency": http.CLIENTS},
                seconds=seconds,
            )
            batch = http.closed_loop(
                cpu,
                {
                    **http.batch_spec(base, size=size, concurrency=http.BATCH_CLIENTS),
                    "headers": auth,
                },
                seconds=seconds,
            )
        http.per_job(single, 1)
        http.per_job(batch, size)
        made = _answered(single, "201") + size * _answered(batch, "200")

        def published() -> bool:
            for service in roles.values():
                service.check_alive()
            return _owned(scratch, owner.pk, status="pending") == 0

        common.wait_until(
            published,
            timeout=max(300, made / 100),
            what="the publisher to publish every job created",
            interval=0.25,
        )
    finally:
        for service in roles.values():
            service.stop()
    in_table = _owned(scratch, owner.pk) - before
    _purge_queue(scratch, http.SIM["type"])
    return {
        "batch_size": size,
        "single": single,
        "batch": batch,
        "batch_vs_single": round(batch["jobs_per_s"] / single["jobs_per_s"], 3)
        if single["jobs_per_s"]
        else None,
        "created": {"answered": made, "in_table": in_table, "ok": in_table == made},
        "procrastinate_defer": _defer_figure(scratch, seconds=seconds, batch=1),
        "procrastinate_batch_defer": _defer_figure(scratch, seconds=seconds, batch=size),
    }


def _answered(figure: dict[str, Any], status: str) -> int:
    """Requests of a `closed_loop` figure, warm-up included, answered `status`."""
    return int(figure["statuses"].get(status, 0)) + int(figure["warmup_statuses"].get(status, 0))


def _owned(scratch: common.Scratch, owner_id: int, status: str | None = None) -> int:
    """Jobs of `owner_id` in the table (in `status`)."""
    sql = "SELECT count(*) FROM jobs WHERE owner_id = %s"
    if status is not None:
        sql += " AND status = %s"
    return int(scratch.scalar(sql, [owner_id, status] if status else [owner_id]))


def _purge_queue(scratch: common.Scratch, job_type: str) -> None:
    """Empty the queue of `job_type`'s jobs: its messages would sit in RabbitMQ (memory,
    its CPU counted whole) through the arms after this one."""
    from django.conf import settings
    from kombu import Connection

    queue = settings.JOB_TYPES.get(job_type, {}).get("queue", job_type)
    with Connection(scratch.broker_url, connect_timeout=10) as conn:
        conn.default_channel.queue_purge(queue)


def _defer_figure(scratch: common.Scratch, *, seconds: float, batch: int) -> dict[str, Any]:
    """Procrastinate's defer (batch 1, 16 coroutines) or batch defer (4), measured."""
    from bench import _procrastinate

    concurrency = http.CLIENTS if batch == 1 else http.BATCH_CLIENTS
    with common.CpuSampler({}, this_process="procrastinate", database=scratch.database) as cpu:
        done = _procrastinate.defer_for(
            "noop", seconds=seconds, batch=batch, concurrency=concurrency
        )
    spent = cpu.ms_per_item(done["began"], done["ended"], int(done["jobs"]))
    # Procrastinate uses neither RabbitMQ nor Redis: what they spent in the window is
    # another run's work (each is one process, counted whole).
    spent = {role: ms for role, ms in spent.items() if role in ("procrastinate", "postgres")}
    return {
        "batch_size": batch,
        "concurrency": concurrency,
        "jobs": done["jobs"],
        "seconds": round(done["ended"] - done["began"], 2),
        "jobs_per_s": common.rate(done["jobs"], done["ended"] - done["began"]),
        "cpu_ms_per_job": {**spent, "total": round(sum(spent.values()), 3)},
    }


def run_child(args: Any) -> int:
    """One arm's phases in this process; the figures as JSON in --out."""
    scratch = common.Scratch(NAME)
    # The parent's places and secrets (Scratch() alone would make new secrets).
    scratch._secrets = {key: os.environ[key] for key in scratch._secrets}
    common.install_signal_handlers()
    CELERY_POOL.update(pool=args.celery_pool, concurrency=args.celery_concurrency or 0)
    scratch.setup_django(JOBOPS_HANDLERS=HANDLERS["noop"])
    out: dict[str, Any] = {}

    def timed(phase: str, measure: Any) -> None:
        began = time.monotonic()
        out[phase] = measure()
        print(
            f"    {args.child} {phase}: {time.monotonic() - began:.0f} s "
            f"{json.dumps(summary_line(out[phase]))}",
            flush=True,
        )

    try:
        if args.child == BATCH:
            timed(
                BATCH,
                lambda: phase_batch(scratch, seconds=args.api_seconds, size=args.batch_size),
            )
        else:
            arm = make_arm(args.child, scratch, args.pool)
            try:
                for phase in args.phases.split(","):
                    if phase in HANDLERS:
                        n = args.jobs if phase == "noop" else args.slow_jobs
                        timed(phase, lambda p=phase, n=n: phase_drain(arm, p, n))
                    elif phase == "live":
                        timed(phase, lambda: phase_live(arm, args.capacity_jobs, args.latency_jobs))
            finally:
                arm.close()
    finally:
        common.stop_all()
    Path(args.out).write_text(json.dumps(out))
    return 0


def summary_line(phase: dict[str, Any]) -> dict[str, Any]:
    if "batch_vs_single" in phase:
        return {
            "single_jobs_per_s": phase["single"]["jobs_per_s"],
            "batch_jobs_per_s": phase["batch"]["jobs_per_s"],
            "ratio": phase["batch_vs_single"],
            "procrastinate_batch_defer_jobs_per_s": phase["procrastinate_batch_defer"][
                "jobs_per_s"
            ],
        }
    if "capacity" in phase:
        return {
            "capacity_per_s": phase["capacity"]["jobs_per_s"],
            "start_p99_ms": phase["latency"]["submit_to_start"]["p99_ms"],
        }
    return {"jobs_per_s": phase["jobs_per_s"], "cpu_ms": phase["cpu_ms_per_job"]["total"]}


# --- the parent: rounds, the seed, the table ------------------------------------------
def run_arm(
    scratch: common.Scratch, args: Any, arm: str, phases: str, extra_env: dict[str, str]
) -> dict[str, Any]:
    """One arm in a child process; its figures, or {"error": ...}."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        out = Path(handle.name)
    argv = [
        *(sys.executable, str(Path(__file__).resolve()), "--child", arm, "--phases", phases),
        *("--out", str(out), "--jobs", str(args.jobs), "--slow-jobs", str(args.slow_jobs)),
        *("--capacity-jobs", str(args.capacity_jobs)),
        *("--latency-jobs", str(args.latency_jobs)),
        *("--pool", args.pool),
        *("--celery-pool", args.celery_pool),
        *("--celery-concurrency", str(args.celery_concurrency or 0)),
        *("--api-seconds", str(args.api_seconds), "--batch-size", str(args.batch_size)),
    ]
    try:
        code = subprocess.run(argv, cwd=common.ROOT, env=scratch.env(**extra_env)).returncode
        if code:
            return {"error": f"exit {code} (see bench/results/logs/{NAME}-*.log)"}
        result: dict[str, Any] = json.loads(out.read_text())
        return result
    finally:
        out.unlink(missing_ok=True)


def arm_env(arm: str) -> dict[str, str]:
    return {"JOBOPS_EXECUTOR_DEFAULT": "postgres"} if arm == "postgres" else {}


def seed_finished_jobs(scratch: common.Scratch, count: int) -> dict[str, Any]:
    """`count` finished jobs in one INSERT ... SELECT over generate_series."""
    with scratch.connect(autocommit=False) as conn:
        template, columns = job_to_clone(conn, none_because="the empty-table rounds made none")
        select = ", ".join(SEED_OVERRIDES.get(c, f"t.{c}") for c in columns)
        began = time.monotonic()
        conn.execute(
            f"INSERT INTO jobs ({', '.join(columns)}) SELECT {select} "  # type: ignore[arg-type]
            "FROM generate_series(1, %s) AS s(n), jobs t WHERE t.id = %s",
            [count, template],
        )
        conn.commit()
        inserted = time.monotonic() - began
    with scratch.connect() as conn:
        conn.execute("VACUUM ANALYZE jobs")
        total = conn.execute("SELECT count(*) FROM jobs WHERE status = 'succeeded'").fetchone()
    return {
        "seeded": count,
        "succeeded_jobs_in_table": int(total[0]) if total else 0,
        "insert_seconds": round(inserted, 1),
        "seconds": round(time.monotonic() - began, 1),
        "cloned_columns": [c for c in columns if c not in SEED_OVERRIDES],
    }


def median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


def pick(run: dict[str, Any], *path: str) -> Any:
    for key in path:
        if not isinstance(run, dict) or key not in run:
            return None
        run = run[key]
    return run


def medians(runs: list[dict[str, Any]], paths: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    """The median over the rounds of each figure at `paths`, with the rounds counted."""
    out: dict[str, Any] = {
        key: median([pick(r, *path) for r in runs]) for key, path in paths.items()
    }
    out["rounds_measured"] = sum(1 for r in runs if "error" not in r)
    out["errors"] = [r["error"] for r in runs if "error" in r]
    return out


def by_process(runs: list[dict[str, Any]], *path: str) -> dict[str, float | None]:
    """The median over the rounds of each process's CPU ms per job at `path`."""
    roles = sorted({role for r in runs for role in (pick(r, *path) or {})})
    return {role: median([pick(r, *path, role) for r in runs]) for role in roles if role != "total"}


def figures_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median over the rounds of each figure of one arm."""
    out = medians(
        runs,
        {
            "noop_jobs_per_s": ("noop", "jobs_per_s"),
            "sleep10_jobs_per_s": ("sleep10", "jobs_per_s"),
            "noop_cpu_ms_per_job": ("noop", "cpu_ms_per_job", "total"),
            "capacity_jobs_per_s": ("live", "capacity", "jobs_per_s"),
            "latency_rate_per_s": ("live", "latency", "submit_rate_per_s"),
            "submit_to_start_p50_ms": ("live", "latency", "submit_to_start", "p50_ms"),
            "submit_to_start_p99_ms": ("live", "latency", "submit_to_start", "p99_ms"),
        },
    )
    out["noop_cpu_ms_by_process"] = by_process(runs, "noop", "cpu_ms_per_job")
    return out


# The batch arm's ways of creating jobs: (key in its figures, label).
CREATES = (
    ("single", "POST /api/v1/jobs, 1 a request"),
    ("batch", "POST /api/v1/jobs/batch, {size:,} a request"),
    ("procrastinate_defer", "Procrastinate defer, 1 a call (context)"),
    ("procrastinate_batch_defer", "Procrastinate batch_defer, {size:,} a call (context)"),
)


def batch_figures_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median over the rounds of each figure of the batch arm."""
    paths: dict[str, tuple[str, ...]] = {"batch_vs_single": (BATCH, "batch_vs_single")}
    for name, _label in CREATES:
        paths[f"{name}_jobs_per_s"] = (BATCH, name, "jobs_per_s")
        paths[f"{name}_cpu_ms_per_job"] = (BATCH, name, "cpu_ms_per_job", "total")
    out = medians(runs, paths)
    for name, _label in CREATES:
        out[f"{name}_cpu_ms_by_process"] = by_process(runs, BATCH, name, "cpu_ms_per_job")
    out["unexpected_answers"] = sum(
        pick(r, BATCH, name, "unexpected") or 0 for r in runs for name in ("single", "batch")
    )
    out["created"] = [pick(r, BATCH, "created") for r in runs if "error" not in r]
    return out


def print_arms(figures: dict[str, dict[str, Any]]) -> None:
    print("  each arm, median of its rounds (CPU: ms per job in the no-op drain's window):")
    print(
        f"    {'arm':<32}{'no-op/s':>9}{'10 ms/s':>9}{'CPU ms':>8}{'capacity':>10}"
        f"{'at /s':>7}{'p50 ms':>8}{'p99 ms':>8}"
    )
    for arm, row in figures.items():
        if not row["rounds_measured"]:
            print(f"    {LABELS[arm]:<32}not measured: {'; '.join(row['errors'])[:80]}")
            continue
        print(
            f"    {LABELS[arm]:<32}{common.fmt(row['noop_jobs_per_s']):>9}"
            f"{common.fmt(row['sleep10_jobs_per_s']):>9}"
            f"{common.fmt(row['noop_cpu_ms_per_job']):>8}"
            f"{common.fmt(row['capacity_jobs_per_s']):>10}"
            f"{common.fmt(row['latency_rate_per_s']):>7}"
            f"{common.fmt(row['submit_to_start_p50_ms']):>8}"
            f"{common.fmt(row['submit_to_start_p99_ms']):>8}"
        )
        print(f"      CPU by process: {common.by_role(row['noop_cpu_ms_by_process'])}")


def print_batch(figures: dict[str, Any], size: int) -> None:
    print(
        "  batch create through the API, median of its rounds (CPU: ms per job, every "
        "process but the API's client):"
    )
    if not figures["rounds_measured"]:
        print(f"    not measured: {'; '.join(figures['errors'])[:80]}")
        return
    print(f"    {'':<52}{'jobs/s':>9}{'CPU ms':>8}")
    for name, label in CREATES:
        print(
            f"    {label.format(size=size):<52}{common.fmt(figures[f'{name}_jobs_per_s']):>9}"
            f"{common.fmt(figures[f'{name}_cpu_ms_per_job']):>8}"
        )
        print(f"      CPU by process: {common.by_role(figures[f'{name}_cpu_ms_by_process'])}")


def not_measured(report: common.Report, key: str, label: str, unit: str) -> None:
    print(f"  {label:<34} not measured (the arm failed or did not run)", flush=True)
    report.data["comparisons"][key] = {"label": label, "value": None, "unit": unit, "met": None}


def ratio_row(
    report: common.Report,
    key: str,
    label: str,
    value: float | None,
    baseline: float | None,
    baseline_label: str,
    target: float | None,
    unit: str = "jobs/s",
    **more: Any,
) -> None:
    """`report.compare` of this run's medians (`more`: its absolute, higher_is_better,
    note), or "not measured" when either is missing."""
    if value is None or baseline is None:
        not_measured(report, key, label, unit)
        return
    report.compare(
        key,
        label=label,
        value=value,
        unit=unit,
        baseline=baseline,
        baseline_label=baseline_label,
        target=target,
        **more,
    )


def target_row(
    report: common.Report, key: str, label: str, value: float | None, unit: str, target: float
) -> None:
    if value is None:
        not_measured(report, key, label, unit)
        return
    report.target(key, label=label, value=value, unit=unit, target=target, higher_is_better=False)


def print_table(
    report: common.Report, figures: dict[str, dict[str, Any]], loaded: dict[str, Any]
) -> None:
    """The executors' rows of issue 39's target table (docs/benchmarks.md), each from
    this run's medians; print_batch_table has the batch create's, bench/api.py the
    single create's against the bare insert."""

    def fig(arm: str, key: str) -> float | None:
        return figures.get(arm, {}).get(key)

    for key, label, arm, base, base_label, target, figure in (
        ("celery_vs_results", "no-op drain, Celery path / +results", "celery", "results",
         "Celery + dj-celery-results", 1.0, "noop_jobs_per_s"),
        ("celery_vs_procrastinate", "no-op drain, Celery path / Procr.", "celery",
         "procrastinate", "Procrastinate", 0.9, "noop_jobs_per_s"),
        ("celery_capacity_vs_results", "capacity, Celery path / +results", "celery", "results",
         "Celery + dj-celery-results", 0.6, "capacity_jobs_per_s"),
        ("celery_sleep10_vs_raw", "10 ms drain, Celery path / raw", "celery", "raw",
         "raw Celery", 0.8, "sleep10_jobs_per_s"),
        ("postgres_vs_raw", "no-op drain, postgres (threads) / raw", "postgres", "raw",
         "raw Celery", 1.8, "noop_jobs_per_s"),
    ):  # fmt: skip
        ratio_row(report, key, label, fig(arm, figure), fig(base, figure), base_label, target)
    for key, label, arm, target in (
        ("celery_cpu_ms_per_job", "CPU per job, all processes, Celery path", "celery", 3.0),
        ("postgres_cpu_ms_per_job", "CPU per job, all processes, postgres", "postgres", 0.5),
    ):
        target_row(report, key, label, fig(arm, "noop_cpu_ms_per_job"), "ms", target)
    target_row(
        report,
        "postgres_start_p99_ms",
        "submit -> start p99 at half capacity, postgres",
        fig("postgres", "submit_to_start_p99_ms"),
        "ms",
        10.0,
    )
    for arm in JOBOPS_ARMS:
        seeded = loaded.get(arm, [])
        ratio_row(
            report,
            f"{arm}_loaded_vs_empty",
            f"drain, {arm}, {loaded.get('seeded', 0):,} finished",
            median([pick(r, "noop", "jobs_per_s") for r in seeded]),
            fig(arm, "noop_jobs_per_s"),
            "same, empty table",
            0.9,
        )
        loaded_cpu = median([pick(r, "noop", "cpu_ms_per_job", "total") for r in seeded])
        empty_cpu = fig(arm, "noop_cpu_ms_per_job")
        if loaded_cpu is None or empty_cpu is None:
            not_measured(report, f"{arm}_loaded_cpu_vs_empty", f"CPU per job, {arm}, full", "ms")
            continue
        report.compare(
            f"{arm}_loaded_cpu_vs_empty",
            label=f"CPU per job, {arm}, full table",
            value=loaded_cpu,
            unit="ms",
            baseline=empty_cpu,
            baseline_label="same, empty table",
            target=1.1,
            higher_is_better=False,
        )


def print_batch_table(report: common.Report, batch: dict[str, Any], batch_size: int) -> None:
    """The batch create's row of issue 39's target table, from the batch arm's medians,
    its CPU per job beside the single create's, and Procrastinate's as context."""
    ratio_row(
        report,
        "batch_vs_single_jobs_per_s",
        f"batch create, {batch_size:,}/request, keys",
        batch["batch_jobs_per_s"],
        batch["single_jobs_per_s"],
        "single POST, same run",
        8.0,
        absolute=2000,
    )
    ratio_row(
        report,
        "batch_vs_single_cpu_per_job",
        "batch create, CPU ms per job",
        batch["batch_cpu_ms_per_job"],
        batch["single_cpu_ms_per_job"],
        "single POST, per job",
        None,
        unit="ms",
        higher_is_better=False,
    )
    ratio_row(
        report,
        "procrastinate_batch_defer_jobs_per_s",
        f"Procr. batch_defer, {batch_size:,}/call",
        batch["procrastinate_batch_defer_jobs_per_s"],
        batch["procrastinate_defer_jobs_per_s"],
        "Procrastinate defer",
        None,
        note="(context, not a target)",
    )


def main() -> int:
    parser = common.parser_for(__doc__)
    parser.add_argument("--jobs", type=int, help="no-op jobs per drain [2000]")
    parser.add_argument("--slow-jobs", type=int, help="10 ms jobs per drain [1000]")
    parser.add_argument("--capacity-jobs", type=int, help="jobs of the capacity run [1000]")
    parser.add_argument("--latency-jobs", type=int, help="jobs at half capacity [2000]")
    parser.add_argument("--seed", type=int, help="finished jobs seeded [1000000]")
    parser.add_argument("--repeat", type=int, help="rounds; each figure is their median [3]")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated arms")
    parser.add_argument(
        "--pool",
        choices=("threads", "processes"),
        default="threads",
        help="the postgres arm's run_worker pool [threads]",
    )
    parser.add_argument(
        "--celery-pool",
        choices=("threads", "prefork"),
        default="threads",
        help="the jobops Celery arm's pool: threads (the Procfile's light group) or prefork",
    )
    parser.add_argument(
        "--celery-concurrency",
        type=int,
        help="the jobops Celery arm's threads or processes [8 threads, 2 prefork]",
    )
    parser.add_argument(
        "--api-seconds", type=float, help="each create figure of the batch arm, seconds [8]"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=http.BATCH_SIZE,
        help="jobs per request of the batch arm's batch create (and per batch_defer) [1000]",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--phases", default="noop,sleep10,live", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args, report = common.prepare(NAME, parser, full=FULL, quick=QUICK)
    if args.child:
        return run_child(args)
    arms = [a for a in args.arms.split(",") if a]
    unknown = set(arms) - set(ARMS)
    if unknown:
        parser.error(f"unknown arms: {sorted(unknown)}")
    skipped: dict[str, str] = {}
    if "postgres" in arms and not RUN_WORKER.exists():
        skipped["postgres"] = "manage.py run_worker is not in this checkout"
        arms.remove("postgres")
    # The batch arm's rounds come after the drains', the seeded ones too (module docstring).
    drain_arms = [a for a in arms if a != BATCH]
    with common.Scratch(NAME, keep=args.keep) as scratch:
        if {"procrastinate", BATCH} & set(arms):
            from bench._procrastinate import schema_argv

            done = subprocess.run(schema_argv(), cwd=common.ROOT, env=scratch.env(), text=True)
            if done.returncode:
                raise common.BenchError("procrastinate schema --apply failed")
        runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in drain_arms}
        for round_ in range(args.repeat if drain_arms else 0):
            turn = round_ % len(drain_arms)
            order = drain_arms[turn:] + drain_arms[:turn]
            print(f"  round {round_ + 1} of {args.repeat}: {', '.join(order)}", flush=True)
            for arm in order:
                runs[arm].append(run_arm(scratch, args, arm, args.phases, arm_env(arm)))
        loaded: dict[str, Any] = {}
        seeded_arms = [a for a in JOBOPS_ARMS if a in arms]
        if seeded_arms and args.seed:
            loaded["seed"] = seed_finished_jobs(scratch, args.seed)
            loaded["seeded"] = args.seed
            print(f"  seeded: {json.dumps(loaded['seed'])[:300]}", flush=True)
            for _round in range(args.repeat):
                for arm in seeded_arms:
                    loaded.setdefault(arm, []).append(
                        run_arm(scratch, args, arm, "noop", arm_env(arm))
                    )
        # The batch arm last of all: the tens of thousands of jobs it creates stay in the
        # table, queued, and would be the background of any drain after it.
        batch_runs = []
        for round_ in range(args.repeat if BATCH in arms else 0):
            print(f"  round {round_ + 1} of {args.repeat}: {BATCH}", flush=True)
            batch_runs.append(run_arm(scratch, args, BATCH, BATCH, {}))
        figures = {arm: figures_of(arm_runs) for arm, arm_runs in runs.items()}
        for arm, why in skipped.items():
            figures[arm] = {"rounds_measured": 0, "errors": [why]}
        batch = batch_figures_of(batch_runs) if BATCH in arms else None
        if figures:
            print_arms(figures)
        if batch is not None:
            print_batch(batch, args.batch_size)
        print("  targets (ratios of this run's medians):")
        if figures:
            print_table(report, figures, loaded)
        if batch is not None:
            print_batch_table(report, batch, args.batch_size)
        report.extra("arms", figures)
        report.extra("rounds", runs)
        report.extra("loaded", loaded)
        report.extra("labels", LABELS)
        measured = {**figures, **({BATCH: batch} if batch is not None else {})}
        report.check(
            "every_arm_measured",
            label="every arm measured in every round",
            ok=all(not f["errors"] for a, f in measured.items() if a not in skipped),
            detail="; ".join(f"{a}: {f['errors']}" for a, f in measured.items() if f["errors"]),
        )
        if batch is not None:
            report.extra(BATCH, batch)
            report.extra("batch_rounds", batch_runs)
            report.check(
                "batch_answers",
                label="every create answered as expected (201, 200)",
                ok=batch["unexpected_answers"] == 0,
                detail=f"{batch['unexpected_answers']} unexpected",
            )
            report.check(
                "batch_jobs_created",
                label="every job the creates answered is in the table",
                ok=all(c["ok"] for c in batch["created"]),
                detail="; ".join(f"{c['in_table']} of {c['answered']}" for c in batch["created"]),
            )
        report.write(scratch)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
