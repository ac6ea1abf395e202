"""Benchmark: verify 1,000,000 audit rows over 100,000 job chains (issue 2, point 10).

1. Drop and re-create a scratch database (jobops_bench_audit, i.e. <db>_bench_audit
   beside the database of DATABASE_URL) and migrate it with `manage.py migrate`.
2. Generate valid chained rows in Python (payloads byte-identical to what
   audit_append writes; checked against rfc8785 on a sample) and load them with COPY.
   Rows are written round by round (event 1 of every job, then event 2, ...) so that
   a chain's rows are spread over the table as they are in production.
3. Write one checkpoint (`manage.py audit_checkpoint`).
4. In a fresh subprocess, time `audit.verification.audit_verify()` over everything
   and read its peak RSS (ru_maxrss, which includes Django itself).
Prints one line per figure and writes bench/results/audit.json.

Usage: python bench/audit.py [--rows 1000000] [--jobs 100000] [--keep]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def scratch_name() -> str:
    """jobops_bench_audit, or <db>_bench_audit beside a non-default DATABASE_URL database,
    so that parallel environments never drop each other's scratch database."""
    import dj_database_url

    if os.environ.get("BENCH_AUDIT_DATABASE"):
        return os.environ["BENCH_AUDIT_DATABASE"]
    name = dj_database_url.parse(
        os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/jobops")
    )["NAME"]
    return f"{name}_bench_audit"


DB_NAME = scratch_name()
GENESIS = "0" * 64
EVENTS = [
    ("created", None, "pending"),
    ("queued", "pending", "queued"),
    ("started", "queued", "running"),
    ("retrying", "running", "retrying"),
    ("queued", "retrying", "queued"),
    ("started", "queued", "running"),
    ("progress", "running", "running"),
    ("progress", "running", "running"),
    ("progress", "running", "running"),
    ("succeeded", "running", "succeeded"),
]


def database_url(name: str) -> str:
    import dj_database_url

    base = dj_database_url.parse(
        os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/jobops")
    )
    auth = base["USER"] + (f":{base['PASSWORD']}" if base.get("PASSWORD") else "")
    return f"postgres://{auth}@{base['HOST'] or '127.0.0.1'}:{base['PORT'] or 5432}/{name}"


def recreate_database(url: str) -> None:
    import psycopg

    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB_NAME}"')


def manage(url: str, *args: str) -> str:
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "config.settings"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout


def payload_text(chain: str, seq: int, ts: str, event: str, job: str, src, dst, attempt) -> str:
    # The canonical (RFC 8785) form of audit_append's payload: keys sorted, no spaces.
    src_json = "null" if src is None else f'"{src}"'
    return (
        f'{{"actor":{{"id":"jobops","type":"system"}},"chain":"{chain}",'
        f'"data":{{"attempt":{attempt},"from":{src_json},"to":"{dst}"}},'
        f'"event_type":"{event}","job_id":"{job}","seq":{seq},"ts":"{ts}"}}'
    )


def check_payload_form() -> None:
    """The f-string above must match rfc8785 byte for byte, or the bench proves nothing."""
    from audit.canonical import canonical_bytes

    job = str(uuid.uuid4())
    expected = canonical_bytes(
        {
            "chain": f"job:{job}",
            "seq": 2,
            "ts": "2026-01-01T00:00:00.000001Z",
            "event_type": "queued",
            "actor": {"type": "system", "id": "jobops"},
            "job_id": job,
            "data": {"from": "pending", "to": "queued", "attempt": 0},
        }
    )
    got = payload_text(
        f"job:{job}", 2, "2026-01-01T00:00:00.000001Z", "queued", job, "pending", "queued", 0
    )
    assert got.encode() == expected, (got, expected)


def load_rows(url: str, rows: int, jobs: int) -> float:
    import psycopg

    per_job = rows // jobs
    job_ids = [str(uuid.UUID(int=(i + 1) * 7919 + (1 << 100))) for i in range(jobs)]
    heads = [GENESIS] * jobs
    start = datetime(2026, 1, 1, tzinfo=UTC)
    started = time.perf_counter()
    columns = (
        "chain, job_id, seq, event_type, actor_type, actor_id, ts, payload, prev_hash, chain_hash"
    )
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        with cur.copy(f"COPY audit_logs ({columns}) FROM STDIN") as copy:
            tick = 0
            for r in range(per_job):
                event, src, dst = EVENTS[r % len(EVENTS)]
                lines = []
                for j, job in enumerate(job_ids):
                    tick += 1
                    ts_dt = start + timedelta(microseconds=tick * 137)
                    ts = ts_dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                    chain = f"job:{job}"
                    text = payload_text(chain, r + 1, ts, event, job, src, dst, r // 4)
                    prev = heads[j]
                    digest = hashlib.sha256(bytes.fromhex(prev) + text.encode()).hexdigest()
                    heads[j] = digest
                    # COPY text format: our values hold no tab, newline or backslash.
                    lines.append(
                        f"{chain}\t{job}\t{r + 1}\t{event}\tsystem\tjobops\t{ts}\t{text}\t"
                        f"{prev}\t{digest}\n"
                    )
                copy.write("".join(lines))
        conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE audit_logs")
    return time.perf_counter() - started


def peak_rss_kb() -> int:
    """VmHWM of this process. ru_maxrss is not used: after fork+exec Linux carries the
    parent's high-water mark into the child, which would charge the loader's memory."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def backend_cpu_seconds(pid: int) -> float | None:
    """CPU used so far by a PostgreSQL backend, when the server runs on this host."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def verify_child() -> None:
    """Runs in a fresh process: time the verification routine, report peak RSS."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from django.db import connection

    from audit.verification import audit_verify

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    pg_before = backend_cpu_seconds(backend)
    rss_before = peak_rss_kb()
    cpu_before = time.process_time()
    started = time.perf_counter()
    report = audit_verify()
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_before
    pg_after = backend_cpu_seconds(backend)
    print(
        json.dumps(
            {
                "ok": report.ok,
                "rows": report.rows_checked,
                "chains": report.chains_checked,
                "checkpoints": report.checkpoints_checked,
                "heads": report.heads_checked,
                "seconds": seconds,
                "cpu_seconds": cpu_seconds,
                "pg_cpu_seconds": None if pg_before is None else pg_after - pg_before,
                "rss_after_django_setup_kb": rss_before,
                "peak_rss_kb": peak_rss_kb(),
                "problems": [str(p) for p in report.problems[:5]],
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    parser.add_argument(
        "--verify-only",
        action="store_true",
        help="re-time verification on a kept scratch database (no drop, no load)",
    )
    parser.add_argument("--verify-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.verify_child:
        verify_child()
        return

    check_payload_form()
    url = database_url(DB_NAME)
    load_seconds = checkpoint_seconds = None
    if not args.verify_only:
        recreate_database(url)
        manage(url, "migrate", "--noinput", "-v", "0")
        load_seconds = round(load_rows(url, args.rows, args.jobs), 2)
        started = time.perf_counter()
        manage(url, "audit_checkpoint")
        checkpoint_seconds = round(time.perf_counter() - started, 2)

    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "config.settings"}
    child = subprocess.run(
        [sys.executable, __file__, "--verify-child"],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    result = json.loads(child.stdout.strip().splitlines()[-1])
    if not result["ok"]:
        raise SystemExit(f"verification failed on generated data: {result['problems']}")
    figures = {
        "rows": result["rows"],
        "chains": result["chains"],
        "checkpoint_heads": result["heads"],
        "load_seconds": load_seconds,
        "checkpoint_seconds": checkpoint_seconds,
        "verify_seconds": round(result["seconds"], 2),
        "verify_rows_per_second": round(result["rows"] / result["seconds"]),
        # CPU of the verifying process only (PostgreSQL's share runs beside it); on a
        # shared, busy machine wall-clock figures vary a lot, so the load is recorded.
        "verify_process_cpu_seconds": round(result["cpu_seconds"], 2),
        "verify_postgres_backend_cpu_seconds": (
            None if result["pg_cpu_seconds"] is None else round(result["pg_cpu_seconds"], 2)
        ),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
        "verify_peak_rss_mb": round(result["peak_rss_kb"] / 1024, 1),
        "rss_after_django_setup_mb": round(result["rss_after_django_setup_kb"] / 1024, 1),
        "target_rows_per_second": 100_000,
        "target_peak_rss_mb": 100,
    }
    for name, value in figures.items():
        print(f"audit.{name}: {value}")
    out = ROOT / "bench" / "results" / "audit.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2) + "\n")
    if not (args.keep or args.verify_only):
        import psycopg

        with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')


if __name__ == "__main__":
    main()
