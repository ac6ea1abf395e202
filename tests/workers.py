"""Real Celery workers and dispatchers as subprocesses, for tests (and a broker fixture).

Usage (in a `@pytest.mark.django_db(transaction=True)` test: a subprocess only sees
committed rows):

    with celery_worker(queues=["sim"], env={"JOBOPS_HANDLERS": json.dumps({...})}) as w:
        job = make_job(...)             # published on commit
        wait_for(lambda: job_status(job.id) == "succeeded")
    w.log_text()                        # the worker's stdout+stderr, for assertions

    with dispatcher_process(interval=0.2):
        ...

- `celery_worker(...)`, `dispatcher_process(...)`: context managers; they start the
  process with the current test database (`connection.settings_dict["NAME"]`) and the
  fast test timings of `FAST_ENV`, wait until it is ready, and stop it on exit
  (SIGTERM, then SIGKILL of its process group).
- `broker` fixture: declares the topology in the current vhost (settings.BROKER_URL)
  and purges every queue of it before the test.
- `wait_for(predicate, timeout=...)`: poll with short sleeps until truthy.
- `subprocess_env(**overrides)`: the environment a worker/dispatcher gets.
- `job_finished(job_id)`, `job_events(job_id)`, `assert_chain_valid(job_id)`: the
  usual assertions' building blocks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Timings small enough that worker death, retries and coalescing take seconds.
FAST_ENV = {
    "JOBOPS_LOCK_TIMEOUT": "3",
    "JOBOPS_HEARTBEAT_SECONDS": "1",
    "JOBOPS_BACKOFF_BASE_SECONDS": "0.2",
    "JOBOPS_PROGRESS_INTERVAL_SECONDS": "0.3",
    "JOBOPS_CANCEL_CHECK_SECONDS": "0.1",
    "JOBOPS_DB_DOWN_REQUEUE_DELAY_SECONDS": "0.5",
    "JOBOPS_DISPATCH_PENDING_AFTER_SECONDS": "0",
    "AUDIT_CHECKPOINT_SECONDS": "3600",
}


def database_url(**overrides: Any) -> str:
    """A URL for the database the tests use now (the test database, not the dev one)."""
    from django.db import connection

    s = {**connection.settings_dict, **overrides}
    auth = quote(s.get("USER") or "postgres")
    if s.get("PASSWORD"):
        auth += ":" + quote(s["PASSWORD"])
    return f"postgres://{auth}@{s.get('HOST') or '127.0.0.1'}:{s.get('PORT') or 5432}/{s['NAME']}"


def subprocess_env(**overrides: str) -> dict[str, str]:
    from django.conf import settings

    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "config.settings_test"),
        "DATABASE_URL": database_url(),
        "BROKER_URL": settings.BROKER_URL,
        "REDIS_URL": settings.REDIS_URL,
        "PYTHONUNBUFFERED": "1",
        **FAST_ENV,
    }
    env.update({k: str(v) for k, v in overrides.items()})
    return env


def wait_for(predicate: Callable[[], Any], *, timeout: float = 20, interval: float = 0.05) -> Any:
    """Poll until `predicate()` is truthy; return its value or fail the test."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {predicate}")
        time.sleep(interval)


FINAL_STATUSES = ("succeeded", "failed", "cancelled")


def job_finished(job_id: Any, *, timeout: float = 40) -> Any:
    """Wait until the job reaches a final status; return the Job."""
    from jobs.models import Job

    def done() -> Any:
        job = Job.objects.get(id=job_id)
        return job if job.status in FINAL_STATUSES else None

    return wait_for(done, timeout=timeout)


def job_events(job_id: Any) -> list[str]:
    from audit.models import AuditLog

    rows = AuditLog.objects.filter(job_id=job_id).order_by("seq")
    return list(rows.values_list("event_type", flat=True))


def assert_chain_valid(job_id: Any) -> None:
    """Recompute the job's hash chain: seq 1..n, each prev_hash and chain_hash."""
    from audit.canonical import GENESIS_HASH, chain_hash
    from audit.models import AuditLog

    prev = GENESIS_HASH
    for n, row in enumerate(AuditLog.objects.filter(job_id=job_id).order_by("seq"), 1):
        assert row.seq == n and row.prev_hash == prev, f"chain broken at seq {row.seq}"
        assert row.chain_hash == chain_hash(prev, row.payload.encode()), f"bad hash at {n}"
        prev = row.chain_hash


class Process:
    """A started subprocess with its log file."""

    def __init__(self, args: list[str], env: dict[str, str], name: str) -> None:
        self.name = name
        self.log_path = Path(tempfile.gettempdir()) / f"jobops-{name}-{uuid.uuid4().hex[:8]}.log"
        self._log = open(self.log_path, "wb")  # closed in stop()
        self.proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (a Celery worker and its pool children)."""
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, timeout: float = 15) -> None:
        if self.alive():
            self.kill(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill(signal.SIGKILL)  # leftovers of the group, if any
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()


@contextmanager
def celery_worker(
    *,
    queues: Iterable[str] = ("default", "model", "cam", "sim", "report", "erp"),
    concurrency: int = 1,
    prefetch_multiplier: int = 1,
    env: dict[str, str] | None = None,
    name: str | None = None,
    ready_timeout: float = 45,
    extra_args: Iterable[str] = (),
) -> Iterator[Process]:
    """Start `celery -A config worker` on `queues` and wait until it consumes."""
    name = name or f"w{uuid.uuid4().hex[:6]}"
    args = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "config",
        "worker",
        "-Q",
        ",".join(queues),
        "-c",
        str(concurrency),
        "--prefetch-multiplier",
        str(prefetch_multiplier),
        "-n",
        f"{name}@%h",
        "-l",
        "info",
        "--without-gossip",
        "--without-mingle",
        *extra_args,
    ]
    worker = Process(args, subprocess_env(**(env or {})), name)
    try:
        wait_for(
            lambda: " ready." in worker.log_text() or not worker.alive(), timeout=ready_timeout
        )
        if not worker.alive():
            raise AssertionError(f"worker {name} exited at start:\n{worker.log_text()[-3000:]}")
        yield worker
    finally:
        worker.stop()


@contextmanager
def dispatcher_process(
    *, interval: float = 0.2, env: dict[str, str] | None = None, name: str | None = None
) -> Iterator[Process]:
    """Start `manage.py run_dispatcher --interval ...` and wait until it loops."""
    name = name or f"d{uuid.uuid4().hex[:6]}"
    args = [sys.executable, "manage.py", "run_dispatcher", "--interval", str(interval)]
    proc = Process(args, subprocess_env(**(env or {})), name)
    try:
        wait_for(lambda: "dispatcher_started" in proc.log_text() or not proc.alive(), timeout=30)
        if not proc.alive():
            raise AssertionError(f"dispatcher {name} exited:\n{proc.log_text()[-3000:]}")
        yield proc
    finally:
        proc.stop()


def run_dispatcher_once(*, env: dict[str, str] | None = None) -> dict[str, Any]:
    """`manage.py run_dispatcher --once` as a subprocess; returns its JSON report."""
    out = subprocess.run(
        [sys.executable, "manage.py", "run_dispatcher", "--once"],
        cwd=ROOT,
        env=subprocess_env(**(env or {})),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def topology_declare_and_purge() -> None:
    """Declare DESIGN.md 4 in the current vhost and empty every queue of it."""
    from django.conf import settings
    from kombu import Connection

    from jobs.topology import topology

    plan = topology()
    with Connection(settings.BROKER_URL, connect_timeout=10) as conn:
        channel = conn.channel()
        for entity in [*plan.exchanges, *plan.queues]:
            entity(channel).declare()
        for queue in plan.queues:
            queue(channel).purge()


# Types whose handler tests replace with tests.handlers.scripted (sim, report, erp keep
# their reference handlers).
SCRIPTED_TYPES = ("ai", "model", "cam")


def scripted_env(**types: dict[str, Any]) -> dict[str, str]:
    """Worker env: SCRIPTED_TYPES run tests.handlers.scripted; `types` tunes the table
    (e.g. cam={"time_limit": 2}) the same way `scripted_table` does in the test process."""
    env = {"JOBOPS_HANDLERS": json.dumps(dict.fromkeys(SCRIPTED_TYPES, "tests.handlers.scripted"))}
    if types:
        env["JOBOPS_JOB_TYPES"] = json.dumps(types)
    return env


def scripted_table(settings: Any, **types: dict[str, Any]) -> None:
    """In the test process (pytest-django `settings` fixture): SCRIPTED_TYPES accept
    script params, and `types` tunes the table like the worker's JOBOPS_JOB_TYPES."""
    import copy

    table = copy.deepcopy(settings.JOB_TYPES)
    for name in SCRIPTED_TYPES:
        table[name]["params_serializer"] = "tests.handlers.ScriptParams"
        table[name]["handler"] = "tests.handlers.scripted"
    for name, fields in types.items():
        table[name].update(fields)
    settings.JOB_TYPES = table


@pytest.fixture
def broker() -> Iterator[None]:
    """The topology declared and every queue purged, before and after the test."""
    topology_declare_and_purge()
    yield
    topology_declare_and_purge()
