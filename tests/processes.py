"""Real processes for tests: Celery workers, dispatchers and manage.py commands.

They run against the test database (`database_url()`: pytest-django's, not the dev
one), so in a transactional test (`@pytest.mark.django_db(transaction=True)`: a
subprocess only sees committed rows):

    with celery_worker(queues=["sim"], env=scripted_env()) as w:
        job = make_job(...)             # published on commit
        job_finished(job.id)            # polls (tests.polling.wait_for), fails loudly
    w.log_text()                        # the worker's stdout+stderr, for assertions

- `celery_worker(...)`, `dispatcher_process(...)`, `run_worker_process(...)` (the
  postgres executor): context managers; they start the
  process with the fast test timings of `FAST_ENV`, wait (with a deadline) until it is
  ready, and stop it on exit (SIGTERM to the process, then SIGKILL of its group).
- `together(celery_worker(...), dispatcher_process(...))`: several of them started
  at once (each waits for its own readiness in a thread) and stopped at once;
  `starting(...)`: the same in the background, waited for when the test needs them.
- `run_manage(...)`, `run_dispatcher_once(...)`: one command to its end.
- `database_url(**overrides)`, `subprocess_env(**overrides)`: what a process gets.
- `job_finished(job_id)`, `job_events(job_id)`, `assert_chain_valid(job_id)`: the
  usual assertions' building blocks.

A test that asserts that something did *not* happen first waits for evidence that the
process did the work that would have made it happen: a dispatcher serves its own
metrics (`dispatcher.metric("dispatcher_step_runs_total", step="publish")`, or
`wait_for_passes`), never a fixed sleep, which on a loaded machine passes without the
process having looked at all.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tests.forkserver import ROOT as ROOT  # tests import it from here
from tests.forkserver import ForkedProcess, spawnable
from tests.forkserver import server as fork_server
from tests.polling import wait_for

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

# Django's system checks (every model, the URLconf, the admin pages) run where a Celery
# worker or a manage.py command starts: a second of a forked worker's two under coverage,
# mostly the URLconf and the admin pages, which a worker imports for nothing else. The
# workers, dispatchers and run_workers started here skip them (Celery's own switch,
# Django's --skip-checks): `manage.py check` runs them in tests/test_settings.py, and
# the Procfile's processes start with them (tests/e2e/test_procfile.py, heavy).
SKIP_CHECKS_ENV = {"CELERY_SKIP_CHECKS": "1"}


def database_url(**overrides: Any) -> str:
    """A URL for the database the tests use now (the test database, not the dev one)."""
    from django.db import connection

    s = {**connection.settings_dict, **overrides}
    auth = quote(s.get("USER") or "postgres")
    if s.get("PASSWORD"):
        auth += ":" + quote(s["PASSWORD"])
    return f"postgres://{auth}@{s.get('HOST') or '127.0.0.1'}:{s.get('PORT') or 5432}/{s['NAME']}"


def subprocess_env(**overrides: str) -> dict[str, str]:
    """A worker's or dispatcher's environment: test settings, this run's database,
    vhost and Redis, the fast timings of FAST_ENV, then `overrides`."""
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


def operator_env(**overrides: str) -> dict[str, str]:
    """What an operator's shell gives manage.py: its own default settings module, and
    the test database."""
    env = {**os.environ, "DATABASE_URL": database_url(), **overrides}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return env


# Production settings that pass every start-up check (DEBUG off needs all of them).
PRODUCTION_SAFE = {
    "DEBUG": "false",
    "SECRET_KEY": "k3y-" + "0123456789abcdef" * 4,
    "ALLOWED_HOSTS": "jobops.example.com",
    "AUDIT_SIGNING_KEY": "a" * 40,
    "AUDIT_SIGNING_ED25519_KEY": "cHJvZHVjdGlvbi1saWtlLWVkMjU1MTktdGVzdC1rZXk=",
    "METRICS_TOKEN": "m" * 32,
    "JOBOPS_WEBHOOK_SECRET_KEY": "cHJvZHVjdGlvbi1saWtlLXdlYmhvb2stc2VjcmV0LWs=",
}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now: for a server to bind, or as
    an address that refuses connections."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_manage(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`manage.py *args` as a real process, to its end (default env: subprocess_env()),
    forked from the fork server (tests/forkserver.py) where it can stand in."""
    argv = [sys.executable, "manage.py", *args]
    env = subprocess_env() if env is None else env
    if not spawnable(argv, env):
        return subprocess.run(
            argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
    with tempfile.TemporaryDirectory(prefix="jobops-manage-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        proc = fork_server.start(argv, env=env, cwd=ROOT, stdout=out, stderr=err)
        try:
            returncode = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
            raise
        read = {"encoding": "utf-8", "errors": "replace"}
        return subprocess.CompletedProcess(
            argv, returncode, out.read_text(**read), err.read_text(**read)
        )


def run_python(
    code: str, *, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`python -c code` as a new interpreter, to its end (default env: subprocess_env()):
    for what must start from nothing (no module a fork server has imported)."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=subprocess_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


FINAL_STATUSES = ("succeeded", "failed", "cancelled")


def job_finished(job_id: Any, *, timeout: float = 40) -> Any:
    """Wait until the job reaches a final status; return the Job."""
    from jobs.models import Job

    def done() -> Any:
        job = Job.objects.get(id=job_id)
        return job if job.status in FINAL_STATUSES else None

    try:
        return wait_for(done, timeout=timeout, what=f"job {job_id} to end")
    except AssertionError as exc:
        now = Job.objects.values_list("status", flat=True).get(id=job_id)
        raise AssertionError(f"{exc}; it is {now}") from None


def job_events(job_id: Any) -> list[str]:
    """The job's audit trail: its event types in seq order."""
    from audit.models import AuditLog

    rows = AuditLog.objects.filter(job_id=job_id).order_by("seq")
    return list(rows.values_list("event_type", flat=True))


def entries_per_transaction(job_ids: Iterable[Any], event_type: str) -> list[int]:
    """How many of these jobs' `event_type` entries each transaction wrote, largest
    first (the xmin of an audit row is the transaction that inserted it; audit rows are
    never updated): how claims and ends were batched."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM audit_logs WHERE job_id = ANY(%s) AND event_type = %s"
            " GROUP BY xmin::text ORDER BY 1 DESC",
            [[str(i) for i in job_ids], event_type],
        )
        return [row[0] for row in cursor.fetchall()]


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

    def __init__(
        self, args: list[str], env: dict[str, str], name: str, *, cwd: Path = ROOT
    ) -> None:
        self.name = name
        port = env.get("JOBOPS_METRICS_PORT", "0")
        self.metrics_port = int(port) if port.isdigit() and int(port) else None
        self.log_path = Path(tempfile.gettempdir()) / f"jobops-{name}-{uuid.uuid4().hex[:8]}.log"
        self._log = open(self.log_path, "wb")  # closed in stop()
        self._terminated = False
        self.proc: subprocess.Popen[bytes] | ForkedProcess
        if spawnable(args, env):  # forked by tests/forkserver.py: the same process, sooner
            self.proc = fork_server.start(args, env=env, cwd=cwd, stdout=self.log_path)
        else:
            self.proc = subprocess.Popen(
                args,
                cwd=cwd,
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

    def local_ports(self) -> set[int]:
        """The local ports of the TCP connections this process's group holds open (read
        from /proc: which sockets its processes have, and the table of connections)."""
        inodes = set()
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                # Field 5 is the process group; the name in field 2 may hold spaces.
                if int(stat.read_text().rsplit(")", 1)[1].split()[2]) != self.pid:
                    continue
                links = [os.readlink(fd) for fd in (stat.parent / "fd").iterdir()]
            except (OSError, ValueError, IndexError):  # a process that ended meanwhile
                continue
            inodes |= {link[8:-1] for link in links if link.startswith("socket:[")}
        ports = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        return ports

    def alive(self) -> bool:
        return self.proc.poll() is None

    def metric(self, name: str, **labels: str) -> float:
        """A sample of this process's own exporter (JOBOPS_METRICS_PORT), by its full name
        and exact labels; 0 when absent (a counter that never moved)."""
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        assert self.metrics_port, f"{self.name} serves no metrics (JOBOPS_METRICS_PORT)"
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return sample.value
        return 0.0

    def wait_for_runs(self, step: str, at_least: int, *, timeout: float = 20) -> float:
        """Wait until this dispatcher has ended `at_least` runs of `step` in all (its
        `dispatcher_step_runs_total`): what the step does was done by then."""
        return wait_for(
            lambda: (n := self.metric("dispatcher_step_runs_total", step=step)) >= at_least and n,
            timeout=timeout,
            what=f"{self.name} to end {at_least} run(s) of its {step} step",
        )

    def wait_for_passes(self, at_least: int, *, timeout: float = 20) -> float:
        """Wait until this dispatcher has ended `at_least` passes of its loop (every step
        of its role ran in the first)."""
        return wait_for(
            lambda: (n := self.metric("dispatcher_passes_total")) >= at_least and n,
            timeout=timeout,
            what=f"{self.name} to end {at_least} pass(es) of its loop",
        )

    def terminate(self) -> None:
        """Begin `stop` now without waiting for it: SIGTERM to the main process, once.
        The test goes on with what needs the process no more while it shuts down (a
        Celery worker's warm shutdown takes seconds); `stop`, at the end of its block,
        waits for it to end."""
        if self.alive() and not self._terminated:
            self.proc.send_signal(signal.SIGTERM)
            self._terminated = True

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (a Celery worker and its pool children)."""
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM to the main process, as a process manager sends it, then SIGKILL of
        what is left of the group.

        Not SIGTERM to the whole group: a Celery worker's pool children would die of it
        half-way through their exit (the main process signals them again in its warm
        shutdown), so `make test` would never see their coverage data. Sent to the main
        process only, the warm shutdown closes the pool and each child leaves through
        its own exit path."""
        if self.alive():
            self.terminate()
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
def _started(process: Process, ready: str, timeout: float) -> Iterator[Process]:
    """Wait until `ready` is in the process's log (it exiting or the deadline fails the
    test with its log); stop it when the block ends."""
    try:
        try:
            wait_for(
                lambda: ready in process.log_text() or not process.alive(),
                timeout=timeout,
                what=f"{process.name} to log {ready!r}",
            )
            if not process.alive():
                raise AssertionError(f"{process.name} exited at start")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{process.log_text()[-3000:]}") from None
        yield process
    finally:
        process.stop()


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
    process = Process(args, subprocess_env(**{**SKIP_CHECKS_ENV, **(env or {})}), name)
    with _started(process, " ready.", ready_timeout) as worker:
        yield worker


@contextmanager
def dispatcher_process(
    *,
    interval: float = 0.2,
    env: dict[str, str] | None = None,
    name: str | None = None,
    role: str = "all",
    extra_args: Iterable[str] = (),
) -> Iterator[Process]:
    """Start `manage.py run_dispatcher --interval ... --role ... *extra_args` and wait
    until it loops. It serves its metrics on a free port (`Process.metric`) unless `env`
    names one."""
    name = name or f"d{uuid.uuid4().hex[:6]}"
    args = [sys.executable, "manage.py", "run_dispatcher", "--skip-checks"]
    args += ["--interval", str(interval)]
    args += ["--role", role, *extra_args]
    env = {"JOBOPS_METRICS_PORT": str(free_port()), **(env or {})}
    process = Process(args, subprocess_env(**env), name)
    with _started(process, "dispatcher_started", 30) as dispatcher:
        yield dispatcher


@contextmanager
def run_worker_process(
    *,
    queues: Iterable[str] = (),
    concurrency: int = 2,
    pool: str = "processes",
    env: dict[str, str] | None = None,
    name: str | None = None,
) -> Iterator[Process]:
    """Start `manage.py run_worker` (the postgres executor) on `queues` (none: every queue
    configured postgres in `env`) and wait until it runs."""
    name = name or f"rw{uuid.uuid4().hex[:6]}"
    args = [sys.executable, "manage.py", "run_worker", "--skip-checks"]
    args += ["--concurrency", str(concurrency)]
    args += ["--pool", pool] + (["--queues", ",".join(queues)] if queues else [])
    process = Process(args, subprocess_env(**(env or {})), name)
    with _started(process, "run_worker_started", 30) as worker:
        yield worker


@contextmanager
def together(*managers: AbstractContextManager[Any]) -> Iterator[tuple[Any, ...]]:
    """Enter the context managers that start processes (celery_worker,
    dispatcher_process, tests.e2e.live_api.gunicorn_server, ...) at once, each in a
    thread of its own, so that they start side by side instead of one after the other;
    yield what each yields, in order; at the end stop them side by side too (after an
    error in the block: one after the other, in reverse order, the error passed on). If
    one fails to start, those that started are stopped and its error is raised."""
    with ThreadPoolExecutor(max_workers=len(managers)) as pool:
        futures = [pool.submit(manager.__enter__) for manager in managers]
    started, values, error = [], [], None
    for manager, future in zip(managers, futures, strict=True):
        try:
            values.append(future.result())
        except BaseException as exc:  # raised once the others are stopped
            error = error or exc
        else:
            started.append(manager)
    try:
        if error is not None:
            raise error
        yield tuple(values)
    except BaseException as exc:
        for manager in reversed(started):
            manager.__exit__(type(exc), exc, exc.__traceback__)
        raise
    with ThreadPoolExecutor(max_workers=len(started)) as pool:
        stops = [pool.submit(manager.__exit__, None, None, None) for manager in started]
    for stop in stops:
        stop.result()


@contextmanager
def starting(*managers: AbstractContextManager[Any]) -> Iterator[Callable[[], tuple[Any, ...]]]:
    """`together(*managers)` started in the background: yields at once a function that
    waits until they are ready and returns what they yield, so that the test does what
    needs none of them (a browser's login) while they start. Stopped at the block's end
    as `together` stops them (after their start has ended, if it was never waited for)."""
    group = together(*managers)
    with ThreadPoolExecutor(max_workers=1) as pool:
        entered = pool.submit(group.__enter__)
        try:
            yield entered.result
        except BaseException as exc:
            if entered.exception() is None:
                group.__exit__(type(exc), exc, exc.__traceback__)
            raise
        group.__exit__(None, None, None)


def run_dispatcher_once(*, env: dict[str, str] | None = None) -> dict[str, Any]:
    """`manage.py run_dispatcher --once` as a subprocess; returns its JSON report."""
    done = run_manage("run_dispatcher", "--once", env=subprocess_env(**(env or {})))
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


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
