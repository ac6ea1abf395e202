"""What every benchmark shares: scratch places, processes, timing and the results file.

A benchmark named `<name>` works only in places named after it, so that it never
touches a development or test database, vhost or Redis key:

- PostgreSQL database `jobops_bench_<name>` on the server of DATABASE_URL (dropped,
  created and migrated at the start, dropped at the end unless --keep);
- RabbitMQ vhost `jobops_bench_<name>` on the broker of BROKER_URL, made with
  `rabbitmqctl` (the management API is not available everywhere); when rabbitmqctl is
  missing the vhost must exist already (an operator makes it once);
- Redis db 3 of REDIS_URL's server (BENCH_REDIS_URL overrides), every key under the
  prefix `jobops_bench_<name>`, removed at the end.

BENCH_SCRATCH_PREFIX replaces `jobops_bench_` in all three names, so that benchmarks of
two checkouts (a paired comparison) on one server never meet.

Subprocesses (gunicorn, celery workers, the dispatcher) get `Scratch.env()`: the
scratch places, `bench.settings_bench` (the app's settings plus the bench endpoint and
the profiling hooks), DEBUG off with throwaway secrets, and rate limits out of the way
unless a benchmark sets its own. Every process started here is stopped when the
benchmark ends, however it ends.

Figures go through `Report`: each line prints the figure beside its baseline from the
same run and the ratio, and `Report.write()` stores them in bench/results/<name>.json
with the facts of the machine they were measured on.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import json
import math
import os
import platform
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"
LOG_DIR = RESULTS_DIR / "logs"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/jobops"
DEFAULT_BROKER_URL = "amqp://guest:guest@127.0.0.1:5672//"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
BENCH_REDIS_DB = 3
# Rate limits high enough never to refuse: throughput benchmarks measure the path, not
# the limiter's refusals (bench/burst.py sets the real ones).
NO_RATE_LIMITS = {
    "create_per_user": 10**9,
    "create_per_org": 10**9,
    "create_global": 10**9,
    "admin_dlq": 10**9,
}


class BenchError(RuntimeError):
    """A benchmark could not produce its figure (a service down, a wait timed out)."""


# --- arguments ---------------------------------------------------------------------
def parser_for(doc: str | None) -> argparse.ArgumentParser:
    """The parser every benchmark starts from: its docstring, --quick and --keep."""
    parser = argparse.ArgumentParser(
        description=(doc or "").split("\n\n")[0],
        epilog=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes, for development (seconds)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the scratch database and vhost afterwards"
    )
    return parser


def resolve_sizes(
    args: argparse.Namespace, *, full: dict[str, Any], quick: dict[str, Any]
) -> argparse.Namespace:
    """Fill every size argument left at None from the full or the --quick table.

    Size arguments default to None so that an explicit `--jobs 200 --quick` wins.
    """
    table = quick if args.quick else full
    for name, value in table.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    return args


def prepare(
    name: str,
    parser: argparse.ArgumentParser,
    *,
    full: dict[str, Any],
    quick: dict[str, Any],
) -> tuple[argparse.Namespace, Report]:
    """Parse the arguments, fill the sizes, open the benchmark's Report."""
    args = resolve_sizes(parser.parse_args(), full=full, quick=quick)
    return args, Report(name, args)


# --- scratch places ------------------------------------------------------------------
def _with_path(url: str, path: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))


def server_database_url(name: str) -> str:
    """DATABASE_URL's server and credentials, database `name`."""
    return _with_path(os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL), f"/{name}")


def vhost_broker_url(vhost: str) -> str:
    """BROKER_URL's broker and credentials, vhost `vhost`.

    kombu builds the URL: "amqp://h//" names the vhost "/", so string surgery on the
    path goes wrong (it made `/jobops_bench_api` of the default URL once).
    """
    from kombu import Connection

    base = Connection(os.environ.get("BROKER_URL", DEFAULT_BROKER_URL))
    return str(base.clone(virtual_host=vhost).as_uri(include_password=True))


def bench_redis_url() -> str:
    if os.environ.get("BENCH_REDIS_URL"):
        return os.environ["BENCH_REDIS_URL"]
    return _with_path(os.environ.get("REDIS_URL", DEFAULT_REDIS_URL), f"/{BENCH_REDIS_DB}")


def _rabbitmqctl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        raise BenchError("rabbitmqctl not found")
    return subprocess.run(
        [ctl, "-q", *args], capture_output=True, text=True, timeout=120, check=check
    )


@dataclass
class Scratch:
    """The scratch database, vhost and Redis prefix of one benchmark (a context manager).

    1. On entry: drop and re-create the database and the vhost (a crashed earlier run
       leaves nothing behind that could skew this one), migrate, declare the topology.
    2. On exit: stop every process this run started, drop vhost and database (unless
       `keep`), delete the Redis keys under the prefix.
    """

    name: str
    keep: bool = False
    migrate: bool = True
    topology: bool = True
    database: str = field(init=False)
    vhost: str = field(init=False)
    database_url: str = field(init=False)
    broker_url: str = field(init=False)
    redis_url: str = field(init=False)
    redis_prefix: str = field(init=False)
    _secrets: dict[str, str] = field(init=False, repr=False)
    _vhost_made: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        # BENCH_SCRATCH_PREFIX: several checkouts benchmarking on one server, apart.
        prefix = os.environ.get("BENCH_SCRATCH_PREFIX", "jobops_bench_")
        self.database = self.vhost = self.redis_prefix = f"{prefix}{self.name}"
        self.database_url = server_database_url(self.database)
        self.broker_url = vhost_broker_url(self.vhost)
        self.redis_url = bench_redis_url()
        # One set per run, shared by every process of the run (sessions, signatures).
        self._secrets = {
            "SECRET_KEY": secrets.token_urlsafe(48),
            "AUDIT_SIGNING_KEY": secrets.token_urlsafe(48),
            "AUDIT_SIGNING_ED25519_KEY": base64.b64encode(secrets.token_bytes(32)).decode(),
            "METRICS_TOKEN": secrets.token_urlsafe(24),
            "JOBOPS_WEBHOOK_SECRET_KEY": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
        }

    # -- lifecycle
    def __enter__(self) -> Scratch:
        install_signal_handlers()
        self.drop_database()
        self._admin_execute(f'CREATE DATABASE "{self.database}"')
        self._make_vhost()
        self._clear_redis()
        if self.migrate:
            self.manage("migrate", "--noinput", "-v", "0")
        if self.topology:
            self.manage("setup_topology")
        return self

    def __exit__(self, *exc: object) -> None:
        stop_all()
        _close_django_connections()
        if self.keep:
            print(f"kept: database {self.database}, vhost {self.vhost}", file=sys.stderr)
        else:
            self.drop_database()
            if self._vhost_made:
                _rabbitmqctl("delete_vhost", self.vhost, check=False)
        self._clear_redis()

    def drop_database(self) -> None:
        self._admin_execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')

    def _admin_execute(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(server_database_url("postgres"), autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[arg-type]  # names are ours, not input

    def _make_vhost(self) -> None:
        from kombu import Connection

        if shutil.which("rabbitmqctl"):
            user = Connection(self.broker_url).userid or "guest"
            _rabbitmqctl("delete_vhost", self.vhost, check=False)
            _rabbitmqctl("add_vhost", self.vhost)
            _rabbitmqctl("set_permissions", "-p", self.vhost, user, ".*", ".*", ".*")
            self._vhost_made = True
            return
        # No rabbitmqctl (e.g. the broker runs in a container): the vhost must exist,
        # and it is reused as it is; it never falls back to a shared vhost.
        try:
            with Connection(self.broker_url, connect_timeout=5) as conn:
                conn.connect()
        except Exception as exc:
            raise BenchError(
                f"rabbitmqctl is missing and vhost {self.vhost!r} is not usable ({exc}); "
                f"create it once: rabbitmqctl add_vhost {self.vhost} && rabbitmqctl "
                f'set_permissions -p {self.vhost} guest ".*" ".*" ".*"'
            ) from exc

    def _clear_redis(self) -> None:
        import redis

        client = redis.Redis.from_url(self.redis_url)
        try:
            keys = list(client.scan_iter(match=f"{self.redis_prefix}*", count=1000))
            if keys:
                client.delete(*keys)
        except redis.RedisError as exc:
            raise BenchError(f"Redis at {self.redis_url} is not usable: {exc}") from exc
        finally:
            client.close()

    # -- what processes see
    def env(self, **extra: str) -> dict[str, str]:
        """The environment of every jobops process of this benchmark."""
        env = {
            **os.environ,
            **self._secrets,
            "DATABASE_URL": self.database_url,
            "BROKER_URL": self.broker_url,
            "REDIS_URL": self.redis_url,
            "JOBOPS_REDIS_PREFIX": self.redis_prefix,
            "JOBOPS_CACHE_PREFIX": self.redis_prefix,
            "DJANGO_SETTINGS_MODULE": "bench.settings_bench",
            # Production mode: DEBUG on records every SQL statement (time and memory).
            "DEBUG": "false",
            # Plain HTTP on localhost, as the postgres superuser: accepted knowingly here.
            "SECURE_SSL_REDIRECT": "false",
            "JOBOPS_DB_ALLOW_PRIVILEGED": "true",
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "JOBOPS_RATE_LIMITS": json.dumps(NO_RATE_LIMITS),
            "JOBOPS_METRICS_PORT": "0",
            # The benchmarks fill the broker before a worker starts (the drain) and
            # compare with raw Celery: no broker window (docs/operator-controls.md#priority),
            # so their figures stay comparable with those before it. A window only
            # delays publishing; it is measured by tests/jobs/test_queues_e2e.py.
            "JOBOPS_BROKER_WINDOW": "1000000",
            "LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        env.update(extra)
        return env

    def manage(self, *args: str, env: dict[str, str] | None = None) -> str:
        """Run `manage.py <args>` against the scratch places; its stdout."""
        done = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=env or self.env(),
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise BenchError(f"manage.py {' '.join(args)} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    def setup_django(self, **extra: str) -> None:
        """Load Django in this process, pointed at the scratch places."""
        os.environ.update(self.env(**extra))
        import django

        django.setup()

    def connect(self, *, autocommit: bool = True) -> Any:
        """A plain psycopg connection to the scratch database (counting, loading)."""
        import psycopg

        return psycopg.connect(self.database_url, autocommit=autocommit)

    def scalar(self, sql: str, params: Any = None) -> Any:
        with self.connect() as conn:
            row = conn.execute(sql, params).fetchone()
        return None if row is None else row[0]


def _close_django_connections() -> None:
    if "django.db" in sys.modules:
        from django.db import connections

        connections.close_all()


# --- processes -----------------------------------------------------------------------
_SERVICES: list[Service] = []
_SIGNALS_INSTALLED = False


def _terminate(signum: int, _frame: object) -> None:
    # Turn SIGTERM into an exception so that `with Scratch(...)` cleans up on the way out.
    raise SystemExit(128 + signum)


def install_signal_handlers() -> None:
    global _SIGNALS_INSTALLED
    if not _SIGNALS_INSTALLED and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
        atexit.register(stop_all)
        _SIGNALS_INSTALLED = True


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU so far of one process (from /proc), or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class Service:
    """A subprocess in its own process group (so its children stop with it), logging to
    bench/results/logs/<bench>-<role>.log, registered for stop_all()."""

    def __init__(self, *, bench: str, role: str, argv: list[str], env: dict[str, str]) -> None:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.role = role
        self.log_path = LOG_DIR / f"{bench}-{role}.log"
        with self.log_path.open("ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} {' '.join(argv)}\n".encode())
            self.proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.peak_rss = self.peak_pss = 0
        self._sampling = threading.Event()
        _SERVICES.append(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise BenchError(f"{self.role} exited with {self.proc.returncode}:\n{tail}")

    def pids(self) -> list[int]:
        """This process and its descendants (pool children, gunicorn workers)."""
        found, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            try:
                for task in Path(f"/proc/{pid}/task").iterdir():
                    todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
        return found

    def memory(self) -> tuple[int, int]:
        """(RSS, PSS) in bytes over the process tree. RSS counts the pages that pool
        children share with their parent once per process; PSS splits them."""
        rss = pss = 0
        for pid in self.pids():
            try:
                for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
            except OSError:
                pass
        return rss, pss

    def cpu_seconds(self) -> float:
        """User + system CPU so far of the live process tree (from /proc)."""
        return sum(process_cpu_seconds(pid) or 0.0 for pid in self.pids())

    def sample_memory(self, interval: float = 0.2) -> None:
        """Keep peak_rss/peak_pss up to date in a background thread until stop()."""

        def sample() -> None:
            while not self._sampling.wait(interval):
                rss, pss = self.memory()
                self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)

        threading.Thread(target=sample, daemon=True, name=f"rss-{self.role}").start()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM to the group (warm shutdown: workers finish, hooks run), then SIGKILL."""
        self._sampling.set()
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        # Pool children that outlived their parent still belong to the group.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self in _SERVICES:
            _SERVICES.remove(self)


# The servers' processes by their command name (/proc/<pid>/comm).
SERVER_ROLES = {"postgres": "postgres", "beam.smp": "rabbitmq", "redis-server": "redis"}


class CpuSampler:
    """CPU seconds spent by each role over time, so that a figure's window (the first
    start to the last finish, read from the audit trail) can be charged to each process.

    Roles are the given services' process trees and the servers of SERVER_ROLES, found
    by name: a run's whole cost, not only the part in Python. Sampled every `interval`
    in a background thread; a process counts from the first sample that sees it.
    `this_process` names the role of the benchmark's own process, when it does part of
    each item's work (submitting jobs, as an API worker would). With `database`, the
    PostgreSQL backends serving other databases are left out (another run's tests on
    the same server); the server's own processes (WAL writer, checkpointer, ...) stay in.
    """

    def __init__(
        self,
        services: dict[str, Service],
        interval: float = 0.25,
        *,
        this_process: str | None = None,
        database: str | None = None,
    ) -> None:
        self._services = services
        self._this_process = this_process
        self._database = database
        self._interval = interval
        self._seen: dict[int, tuple[str, float, float]] = {}  # pid -> (role, first, last)
        self._samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="cpu-sampler")

    def __enter__(self) -> CpuSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def _roles(self) -> dict[int, str]:
        roles = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    role = SERVER_ROLES.get((entry / "comm").read_text().strip())
                    if role == "postgres" and self._database and self._other_database(entry):
                        continue
                except OSError:
                    continue
                if role:
                    roles[int(entry.name)] = role
        for role, service in self._services.items():
            roles.update(dict.fromkeys(service.pids(), role))
        if self._this_process:
            roles[os.getpid()] = self._this_process
        return roles

    def _other_database(self, proc: Path) -> bool:
        """A client backend ("postgres: [cluster: ]user database host(port) state")
        of a database other than ours."""
        title = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        words = title.split()
        client = next((n for n, w in enumerate(words) if "(" in w or w == "[local]"), None)
        return client is not None and client >= 2 and words[client - 1] != self._database

    def _sample(self) -> None:
        now = time.time()
        for pid, role in self._roles().items():
            seconds = process_cpu_seconds(pid)
            if seconds is None:
                continue
            first = self._seen[pid][1] if pid in self._seen else seconds
            self._seen[pid] = (role, first, seconds)
        totals: dict[str, float] = {}
        for role, first, last in self._seen.values():
            totals[role] = totals.get(role, 0.0) + last - first
        self._samples.append((now, totals))

    def _at(self, moment: float) -> dict[str, float]:
        """Each role's CPU seconds at `moment`, interpolated between two samples."""
        before = [s for s in self._samples if s[0] <= moment] or self._samples[:1]
        after = [s for s in self._samples if s[0] >= moment] or self._samples[-1:]
        (t0, a), (t1, b) = before[-1], after[0]
        share = (moment - t0) / (t1 - t0) if t1 > t0 else 0.0
        return {r: a.get(r, 0.0) + share * (b.get(r, 0.0) - a.get(r, 0.0)) for r in b}

    def ms_per_item(self, start: float, end: float, items: int) -> dict[str, float]:
        """CPU ms per item by role between `start` and `end` (time.time()), with `total`."""
        a, b = self._at(start), self._at(end)
        spent = {r: 1000 * (b[r] - a.get(r, 0.0)) / max(items, 1) for r in b}
        spent = {r: round(ms, 3) for r, ms in sorted(spent.items()) if ms >= 0.0005}
        return {**spent, "total": round(sum(spent.values()), 3)}


def by_role(spent: dict[str, float]) -> str:
    """`CpuSampler.ms_per_item`'s figures as one line, the total left out."""
    return " ".join(f"{role} {ms:.2f}" for role, ms in spent.items() if role != "total")


def stop_all() -> None:
    for service in list(reversed(_SERVICES)):
        service.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_gunicorn(
    *, bench: str, env: dict[str, str], workers: int, probe: str, headers: dict[str, str]
) -> tuple[Service, str]:
    """gunicorn (sync workers, the production server) on a free port; returns once
    `probe` answers 2xx/3xx with `headers`."""
    import requests

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    service = Service(
        bench=bench,
        role="web",
        argv=[
            *(sys.executable, "-m", "gunicorn", "config.wsgi", "--bind", f"127.0.0.1:{port}"),
            *("--workers", str(workers), "--worker-class", "sync", "--log-level", "warning"),
            # A backlog that holds a thousand concurrent clients (bench/burst.py).
            *("--backlog", "2048"),
        ],
        env=env,
    )

    def answers() -> bool:
        service.check_alive()
        try:
            return requests.get(f"{base}{probe}", headers=headers, timeout=5).status_code < 400
        except requests.RequestException:
            return False

    wait_until(answers, timeout=90, what="gunicorn to answer")
    return service, base


def start_worker(
    *,
    bench: str,
    env: dict[str, str],
    queues: str,
    concurrency: int = 2,
    prefetch: int = 3,
    app: str = "config",
    pool: str = "prefork",
    role: str = "worker",
) -> Service:
    """A Celery worker as `make worker` starts the light group (prefork, prefetch 3).

    Returns once it consumes from every queue in `queues`.
    """
    service = Service(
        bench=bench,
        role=role,
        argv=[
            *(sys.executable, "-m", "celery", "-A", app, "worker", "-Q", queues),
            *("-c", str(concurrency), "--prefetch-multiplier", str(prefetch), "-P", pool),
            *("-l", "warning", "--without-gossip", "--without-mingle", "--without-heartbeat"),
            *("-n", f"{role}-{os.getpid()}@%h"),
        ],
        env=env,
    )
    service.sample_memory()
    for queue in queues.split(","):
        wait_until(
            lambda q=queue: service.check_alive() or consumer_count(env["BROKER_URL"], q) > 0,
            timeout=90,
            what=f"{role} to consume {queue}",
        )
    return service


def start_dispatcher(
    *, bench: str, env: dict[str, str], role: str = "dispatcher", loop: str = "all"
) -> Service:
    """`manage.py run_dispatcher --role <loop>` (jobs.dispatcher.ROLES)."""
    return Service(
        bench=bench,
        role=role,
        argv=[sys.executable, str(ROOT / "manage.py"), "run_dispatcher", "--role", loop],
        env=env,
    )


def start_dispatchers(*, bench: str, env: dict[str, str]) -> dict[str, Service]:
    """The dispatcher as `make run` starts it (Procfile): the loop on the clock and the
    publisher that answers NOTIFY; by role, as CpuSampler takes them."""
    return {
        "dispatcher": start_dispatcher(bench=bench, env=env, loop="maintain"),
        "publisher": start_dispatcher(bench=bench, env=env, role="publisher", loop="publish"),
    }


def consumer_count(broker_url: str, queue: str) -> int:
    from kombu import Connection

    with Connection(broker_url, connect_timeout=5) as conn:
        return int(conn.default_channel.queue_declare(queue, passive=True).consumer_count)


def queue_depth(broker_url: str, queue: str) -> int:
    from kombu import Connection

    with Connection(broker_url, connect_timeout=5) as conn:
        return int(conn.default_channel.queue_declare(queue, passive=True).message_count)


def raw_confirmed_publish(
    broker_url: str,
    *,
    exchange: str,
    routing_key: str,
    bodies: list[bytes],
    batch: int = 1000,
) -> float:
    """The broker's floor for a relay: publish `bodies` persistent and `mandatory`,
    one confirm wait per `batch`; returns the seconds it took."""
    from kombu import Connection

    with Connection(broker_url, connect_timeout=10) as conn:
        channel = conn.channel()
        acked = [0]
        channel.events["basic_ack"].add(
            lambda tag, multiple: acked.__setitem__(0, tag if multiple else acked[0] + 1)
        )
        channel.confirm_select()
        started = time.perf_counter()
        for offset in range(0, len(bodies), batch):
            chunk = bodies[offset : offset + batch]
            for body in chunk:
                message = channel.prepare_message(
                    body,
                    content_type="application/json",
                    content_encoding="utf-8",
                    properties={"delivery_mode": 2},
                )
                channel.basic_publish(
                    message, exchange=exchange, routing_key=routing_key, mandatory=True
                )
            while acked[0] < offset + len(chunk):
                conn.drain_events(timeout=30)
        seconds = time.perf_counter() - started
        channel.close()
    return seconds


def drain_queue(
    broker_url: str, queue: str, handle: Callable[[Any], None], *, idle: float = 2.0
) -> int:
    """Consume `queue` until it stays quiet for `idle` seconds; returns the count.

    A consumer (no_ack), not basic_get: one round trip per message would make counting
    40,000 events slower than relaying them. `handle` gets each py-amqp message.
    """
    from kombu import Connection

    count = [0]
    with Connection(broker_url, connect_timeout=10) as conn:
        channel = conn.channel()

        def on_message(message: Any) -> None:
            handle(message)
            count[0] += 1

        channel.basic_consume(queue, callback=on_message, no_ack=True)
        while True:
            try:
                conn.drain_events(timeout=idle)
            except TimeoutError:
                break
        channel.close()
    return count[0]


# --- timing ----------------------------------------------------------------------------
def wait_until(
    predicate: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.1
) -> None:
    """Poll until `predicate()` is truthy; raise BenchError naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


@contextmanager
def stopwatch() -> Iterator[dict[str, float]]:
    """`with stopwatch() as t: ...` then t["seconds"]."""
    timing = {"seconds": 0.0}
    started = time.perf_counter()
    try:
        yield timing
    finally:
        timing["seconds"] = time.perf_counter() - started


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(p / 100 * len(ordered))))
    return ordered[rank - 1]


def latency_summary(ms: list[float]) -> dict[str, float | int | None]:
    """Count, mean, p50, p90, p99 and max of latencies in milliseconds."""
    if not ms:
        return {"n": 0, "mean_ms": None, "p50_ms": None, "p90_ms": None, "p99_ms": None}
    return {
        "n": len(ms),
        "mean_ms": round(sum(ms) / len(ms), 2),
        "p50_ms": round(percentile(ms, 50), 2),
        "p90_ms": round(percentile(ms, 90), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "max_ms": round(max(ms), 2),
    }


def rate(count: float, seconds: float) -> float:
    return round(count / seconds, 1) if seconds > 0 else 0.0


def peak_rss_kb() -> int:
    """VmHWM of this process (ru_maxrss would carry the parent's pre-exec high-water)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


# --- results ---------------------------------------------------------------------------
def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_facts(scratch: Scratch | None = None) -> dict[str, Any]:
    """What a figure depends on besides the code: hardware, load, service versions."""
    from importlib.metadata import PackageNotFoundError, version

    facts: dict[str, Any] = {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "git_commit": _git("rev-parse", "HEAD"),
        # Uncommitted changes outside bench/ mean the figures belong to no commit.
        "git_dirty_app": bool(_git("status", "--porcelain", "--", ".", ":!bench")),
    }
    try:
        mem = Path("/proc/meminfo").read_text().split("\n", 1)[0].split()
        facts["memory_mb"] = int(mem[1]) // 1024
    except (OSError, IndexError, ValueError):
        pass
    packages = {}
    for name in ("django", "celery", "kombu", "psycopg", "djangorestframework", "gunicorn"):
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            pass
    facts["packages"] = packages
    if scratch is not None:
        facts["services"] = _service_versions(scratch)
    return facts


def _service_versions(scratch: Scratch) -> dict[str, str]:
    versions: dict[str, str] = {}
    try:
        versions["postgresql"] = str(scratch.scalar("SHOW server_version"))
    except Exception as exc:
        versions["postgresql"] = f"unknown ({exc})"
    try:
        from kombu import Connection

        with Connection(scratch.broker_url, connect_timeout=5) as conn:
            conn.connect()
            props = conn.connection.server_properties
            versions["rabbitmq"] = str(props.get("version", "?"))
    except Exception as exc:
        versions["rabbitmq"] = f"unknown ({exc})"
    try:
        import redis

        client = redis.Redis.from_url(scratch.redis_url)
        versions["redis"] = str(client.info("server").get("redis_version"))
        client.close()
    except Exception as exc:
        versions["redis"] = f"unknown ({exc})"
    return versions


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


class Report:
    """Figures of one benchmark run: printed as they come, written as one JSON file.

    `compare` is the line every benchmark exists for: a figure, its baseline measured
    in the same run on the same services, their ratio and the target from issue 10.
    """

    def __init__(self, name: str, args: argparse.Namespace | None = None) -> None:
        self.name = name
        self.started = time.time()
        self.loadavg_start = [round(x, 2) for x in os.getloadavg()]
        self.data: dict[str, Any] = {
            "benchmark": name,
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "arguments": {k: v for k, v in vars(args or argparse.Namespace()).items()},
            "figures": {},
            "comparisons": {},
            "checks": {},
        }
        print(f"== {name} ({self.data['command']})", flush=True)

    def figure(self, key: str, value: Any, unit: str = "", label: str | None = None) -> Any:
        self.data["figures"][key] = value
        print(f"  {label or key:<46} {fmt(value):>12} {unit}", flush=True)
        return value

    def compare(
        self,
        key: str,
        *,
        label: str,
        value: float,
        baseline: float,
        baseline_label: str,
        unit: str,
        target: float | None = None,
        absolute: float | None = None,
        higher_is_better: bool = True,
        note: str = "",
    ) -> float | None:
        """Print `label value unit | baseline_label baseline | ratio (targets)`.

        The ratio is value / baseline; `target` bounds the ratio, `absolute` the value
        itself (issue 10 gives some targets as ratios, some as rates). With
        `higher_is_better` False (latencies, memory, slowdowns) both are upper bounds.
        """
        ratio = round(value / baseline, 3) if baseline else None
        checks = []
        if target is not None:
            checks.append(
                (
                    "ratio",
                    target,
                    None if ratio is None else self._met(ratio, target, higher_is_better),
                )
            )
        if absolute is not None:
            checks.append((unit, absolute, self._met(value, absolute, higher_is_better)))
        met = None if not checks else all(c[2] for c in checks)
        self.data["comparisons"][key] = {
            "label": label,
            "value": value,
            "baseline": baseline,
            "baseline_label": baseline_label,
            "unit": unit,
            "ratio": ratio,
            "target_ratio": target,
            "target_value": absolute,
            "target_is": "min" if higher_is_better else "max",
            "met": met,
            "note": note,
        }
        op = ">=" if higher_is_better else "<="
        goals = "".join(
            f"  [{'ratio ' if what == 'ratio' else ''}{op} {fmt(bound)}"
            f"{'' if what == 'ratio' else ' ' + what}: {'met' if ok else 'MISSED'}]"
            for what, bound, ok in checks
        )
        print(
            f"  {label:<34} {fmt(value):>9} {unit:<7}| {baseline_label:<24} "
            f"{fmt(baseline):>9} | ratio {'n/a' if ratio is None else f'{ratio:.2f}'}{goals}"
            + (f"  {note}" if note else ""),
            flush=True,
        )
        return ratio

    @staticmethod
    def _met(value: float, bound: float, higher_is_better: bool) -> bool:
        return value >= bound if higher_is_better else value <= bound

    def target(
        self,
        key: str,
        *,
        label: str,
        value: float,
        unit: str,
        target: float,
        higher_is_better: bool = True,
    ) -> bool:
        """A figure with an absolute target and no baseline (e.g. a p99 in ms)."""
        met = self._met(value, target, higher_is_better)
        self.data["comparisons"][key] = {
            "label": label,
            "value": value,
            "unit": unit,
            "target_value": target,
            "target_is": "min" if higher_is_better else "max",
            "met": met,
        }
        print(
            f"  {label:<34} {fmt(value):>9} {unit:<7}| [{'>=' if higher_is_better else '<='} "
            f"{fmt(target)} {unit}: {'met' if met else 'MISSED'}]",
            flush=True,
        )
        return met

    def check(self, key: str, *, label: str, ok: bool, detail: str = "") -> bool:
        """A correctness count that must hold (0 lost, 0 duplicated, ...)."""
        self.data["checks"][key] = {"label": label, "ok": ok, "detail": detail}
        print(f"  {label:<46} {'ok' if ok else 'FAILED'}  {detail}", flush=True)
        return ok

    def extra(self, key: str, value: Any) -> None:
        """Raw detail for the JSON only (per-phase timings, plans, samples)."""
        self.data[key] = value

    def write(self, scratch: Scratch | None = None) -> Path:
        self.data["seconds"] = round(time.time() - self.started, 1)
        self.data["machine"] = machine_facts(scratch)
        self.data["machine"]["loadavg_at_start"] = self.loadavg_start
        path = RESULTS_DIR / f"{self.name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        failed = [c["label"] for c in self.data["checks"].values() if not c["ok"]]
        print(
            f"  results in {path.relative_to(ROOT)} ({self.data['seconds']} s, load "
            f"{self.loadavg_start[0]} -> {self.data['machine']['loadavg'][0]} on "
            f"{self.data['machine']['cpus']} cpus)" + (f"; FAILED: {failed}" if failed else ""),
            flush=True,
        )
        return path

    @property
    def failed(self) -> bool:
        return any(not c["ok"] for c in self.data["checks"].values())
