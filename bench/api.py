"""Benchmark: the jobs API under gunicorn (issue 4, point 9).

One gunicorn (bench/settings_bench.py: the real app plus a bare DRF endpoint, same
workers for both) on a scratch database, driven by a pure-Python client
(threads + requests.Session) at concurrency 16, one figure after another:

- `POST /api/v1/jobs`, a new idempotency key each request (the real path: rate
  limit, backpressure read, insert + audit + outbox, publish with confirm);
- `POST /bench/bare`: token auth + one INSERT, the floor (target ratio >= 0.5);
- `GET /api/v1/jobs/{id}` 200 (a job with 3 artefacts) and with `If-None-Match` 304
  (target 304 >= 1.5 x the 200 path);
- `POST /api/v1/jobs` repeating an existing key (200);
- diagnostic: `POST /api/v1/jobs` on a second gunicorn whose broker is unreachable,
  i.e. the request without its after-commit publish (the job stays pending).

1. Re-create the scratch database `<db>_bench_api` (beside DATABASE_URL's) and migrate.
2. Use a scratch RabbitMQ vhost of the same name when `rabbitmqctl` works (so the
   thousands of published jobs never land in a real vhost), else BROKER_URL.
3. Start gunicorn with DEBUG off and production-like settings, run the figures,
   stop it, drop the scratch vhost (and database unless --keep).
Prints one line per figure and writes bench/results/api.json.

Usage: python bench/api.py [--workers 4] [--concurrency 16] [--seconds 8] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import requests
from kombu import Connection

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "api.json"


def base_database_url() -> str:
    return os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/jobops")


def scratch_name() -> str:
    import dj_database_url

    return f"{dj_database_url.parse(base_database_url())['NAME']}_bench_api"


def database_url(name: str) -> str:
    return base_database_url().rsplit("/", 1)[0] + f"/{name}"


def recreate_database(name: str) -> None:
    import psycopg

    with psycopg.connect(database_url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(name: str) -> None:
    import psycopg

    with psycopg.connect(database_url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def scratch_vhost(name: str) -> str | None:
    """A fresh vhost on the local broker, or None when rabbitmqctl is not usable."""
    ctl = shutil.which("rabbitmqctl")
    if not ctl:
        return None
    try:
        subprocess.run([ctl, "-q", "delete_vhost", name], capture_output=True, timeout=60)
        subprocess.run([ctl, "-q", "add_vhost", name], check=True, capture_output=True, timeout=60)
        subprocess.run(
            [ctl, "-q", "set_permissions", "-p", name, "guest", ".*", ".*", ".*"],
            check=True,
            capture_output=True,
            timeout=60,
        )
    except (subprocess.SubprocessError, OSError):
        return None
    return name


def drop_vhost(name: str) -> None:
    ctl = shutil.which("rabbitmqctl")
    if ctl:
        subprocess.run([ctl, "-q", "delete_vhost", name], capture_output=True, timeout=60)


def broker_url_for(vhost: str | None) -> str:
    base = os.environ.get("BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
    if vhost is None:
        return base
    # kombu builds the URL: "amqp://h//" names vhost "/", so string surgery on it goes wrong.
    return Connection(base).clone(virtual_host=vhost).as_uri(include_password=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout


def start_gunicorn(
    env: dict[str, str], *, workers: int, auth: dict[str, str]
) -> tuple[subprocess.Popen[bytes], str]:
    """gunicorn (sync workers) on a free port; returns once it answers an API call."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "gunicorn", "config.wsgi", "--bind", f"127.0.0.1:{port}"),
            *("--workers", str(workers), "--worker-class", "sync", "--log-level", "warning"),
        ],
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            if requests.get(f"{base}/api/v1/jobs", headers=auth, timeout=5).ok:
                return process, base
        except requests.RequestException:
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            stop(process)
            raise RuntimeError("gunicorn did not come up")
        time.sleep(0.2)


def stop(process: subprocess.Popen[bytes] | None) -> None:
    if process is None or process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


SETUP_SCRIPT = """
import json
from django.contrib.auth import get_user_model
from django.db import connection
from rest_framework.authtoken.models import Token
from bench.urls_bench import BENCH_TABLE_SQL
from jobs.services import artefact_save, job_create

with connection.cursor() as cursor:
    cursor.execute(BENCH_TABLE_SQL)
user = get_user_model().objects.create_user("bench", password="bench-pw-not-secret")
token = Token.objects.create(user=user).key
job, _ = job_create(owner=user, job_type="sim", params={"steps": 3}, idempotency_key="read-me")
for n in range(3):
    artefact_save(job_id=job.id, kind="report", name=f"part-{n}.csv", data=b"a,b\\n" * 100)
job_create(owner=user, job_type="sim", params={"steps": 3}, idempotency_key="repeat-me")
print(json.dumps({"token": token, "job_id": str(job.id)}))
"""


def load(
    *,
    url: str,
    method: str,
    headers: dict[str, str],
    body: Any = None,
    body_factory: Any = None,
    concurrency: int,
    seconds: float,
    expect: int,
) -> dict[str, Any]:
    """Drive `concurrency` threads for `seconds`; latencies in ms, status counts."""
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    lock = threading.Lock()
    start_barrier = threading.Barrier(concurrency + 1)
    stop_at = [0.0]

    def worker() -> None:
        mine: list[float] = []
        counts: Counter[int] = Counter()
        with requests.Session() as session:
            session.headers.update(headers)
            start_barrier.wait()
            while time.perf_counter() < stop_at[0]:
                payload = body_factory() if body_factory else body
                began = time.perf_counter()
                response = session.request(method, url, json=payload, timeout=30)
                mine.append((time.perf_counter() - began) * 1000)
                counts[response.status_code] += 1
        with lock:
            latencies.extend(mine)
            statuses.update(counts)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    stop_at[0] = time.perf_counter() + seconds
    began = time.perf_counter()
    start_barrier.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    latencies.sort()
    unexpected = {code: n for code, n in statuses.items() if code != expect}
    return {
        "requests": len(latencies),
        "seconds": round(elapsed, 2),
        "req_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(statistics.median(latencies), 2) if latencies else None,
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1], 2) if latencies else None,
        "statuses": dict(statuses),
        "unexpected_statuses": unexpected,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4, help="gunicorn workers (both paths)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8.0, help="per figure")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args()

    name = scratch_name()
    recreate_database(name)
    vhost = scratch_vhost(name)
    env = {
        **os.environ,
        "DATABASE_URL": database_url(name),
        "BROKER_URL": broker_url_for(vhost),
        "DJANGO_SETTINGS_MODULE": "bench.settings_bench",
        # Production-like: DEBUG off (no query log), so the production checks need values.
        "DEBUG": "false",
        # Plain HTTP on localhost, as the postgres superuser: accepted here knowingly.
        "SECURE_SSL_REDIRECT": "false",
        "JOBOPS_DB_ALLOW_PRIVILEGED": "true",
        "SECRET_KEY": secrets.token_urlsafe(48),
        "AUDIT_SIGNING_KEY": secrets.token_urlsafe(48),
        "METRICS_TOKEN": secrets.token_urlsafe(24),
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "JOBOPS_RATE_LIMITS": json.dumps(
            {"create_per_user": 10**9, "create_global": 10**9, "admin_dlq": 10**9}
        ),
        "JOBOPS_REDIS_PREFIX": f"bench-api-{uuid.uuid4().hex[:8]}",
        "LOG_LEVEL": "WARNING",
    }
    process = None
    try:
        manage(env, "migrate", "--noinput", "-v", "0")
        manage(env, "setup_topology")
        setup = json.loads(manage(env, "shell", "-c", SETUP_SCRIPT).strip().splitlines()[-1])
        auth = {"Authorization": f"Token {setup['token']}"}
        process, base = start_gunicorn(env, workers=args.workers, auth=auth)

        job_url = f"{base}/api/v1/jobs/{setup['job_id']}"
        etag = requests.get(job_url, headers=auth, timeout=5).headers["ETag"]
        sim = {"type": "sim", "params": {"steps": 3}}
        common = {"concurrency": args.concurrency, "seconds": args.seconds, "headers": auth}
        figures: dict[str, dict[str, Any]] = {}
        plan = [
            ("bare_post", dict(url=f"{base}/bench/bare", method="POST", body=sim, expect=201)),
            (
                "create_post",
                dict(
                    url=f"{base}/api/v1/jobs",
                    method="POST",
                    body_factory=lambda: {**sim, "idempotency_key": uuid.uuid4().hex},
                    expect=201,
                ),
            ),
            ("get_200", dict(url=job_url, method="GET", expect=200)),
            (
                "get_304",
                dict(
                    url=job_url,
                    method="GET",
                    expect=304,
                    headers={**auth, "If-None-Match": etag},
                ),
            ),
            (
                "repeat_post",
                dict(
                    url=f"{base}/api/v1/jobs",
                    method="POST",
                    body={**sim, "idempotency_key": "repeat-me"},
                    expect=200,
                ),
            ),
        ]
        for label, spec in plan:
            # A short warm-up so that every worker has its connections and imports.
            load(**{**common, **spec, "seconds": 1.0})
            figures[label] = load(**{**common, **spec})

        # Diagnostic: the same create with the broker unreachable (connection refused at
        # once; the publisher then skips publishing for 5 s): what the request costs
        # without its after-commit publish-with-confirm. Jobs stay pending.
        stop(process)
        process = None
        dead_broker = {**env, "BROKER_URL": "amqp://guest:guest@127.0.0.1:1//"}
        process, base = start_gunicorn(dead_broker, workers=args.workers, auth=auth)
        create_spec = dict(plan[1][1])
        create_spec["url"] = f"{base}/api/v1/jobs"
        load(**{**common, **create_spec, "seconds": 1.0})
        figures["create_post_no_publish"] = load(**{**common, **create_spec})

        ratio_create = figures["create_post"]["req_per_s"] / figures["bare_post"]["req_per_s"]
        ratio_304 = figures["get_304"]["req_per_s"] / figures["get_200"]["req_per_s"]
        result = {
            "benchmark": "api",
            "command": "python bench/api.py " + " ".join(sys.argv[1:]),
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "loadavg_at_end": os.getloadavg(),
            },
            "gunicorn_workers": args.workers,
            "concurrency": args.concurrency,
            "seconds_per_figure": args.seconds,
            "broker_vhost": vhost or "(BROKER_URL as configured)",
            "figures": figures,
            "ratios": {
                "create_vs_bare": round(ratio_create, 3),
                "get_304_vs_200": round(ratio_304, 3),
                "create_no_publish_vs_bare": round(
                    figures["create_post_no_publish"]["req_per_s"]
                    / figures["bare_post"]["req_per_s"],
                    3,
                ),
            },
            "targets": {"create_vs_bare": 0.5, "get_304_vs_200": 1.5},
        }
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")

        def line(label: str, text: str) -> None:
            f = figures[label]
            print(
                f"{text:<40} {f['req_per_s']:>8.1f} req/s  p50 {f['p50_ms']:>7.2f} ms  "
                f"p99 {f['p99_ms']:>7.2f} ms  ({f['requests']} requests"
                + (f", unexpected {f['unexpected_statuses']})" if f["unexpected_statuses"] else ")")
            )

        line("create_post", "POST /api/v1/jobs (new key)")
        line("bare_post", "POST /bench/bare (token auth + 1 insert)")
        print(f"{'create / bare ratio':<40} {ratio_create:>8.3f}    (target >= 0.5)")
        line("create_post_no_publish", "POST /api/v1/jobs, broker unreachable")
        line("get_200", "GET /api/v1/jobs/{id} 200")
        line("get_304", "GET /api/v1/jobs/{id} If-None-Match 304")
        print(f"{'304 / 200 ratio':<40} {ratio_304:>8.3f}    (target >= 1.5)")
        line("repeat_post", "POST /api/v1/jobs (existing key) 200")
        print(f"results in {RESULTS.relative_to(ROOT)}")
        return 0
    finally:
        stop(process)
        if vhost:
            drop_vhost(vhost)
        if not args.keep:
            drop_database(name)


if __name__ == "__main__":
    sys.exit(main())
