"""Suite-wide fixtures. Every test talks to the real PostgreSQL, RabbitMQ and Redis.

The toolkit has one conftest layer per package: this file for what several packages
need (the flush after transactional tests, the broker, the ERP queues, log capture, an
OTP-verified admin), `tests/<package>/conftest.py` for that package's own fixtures.
Helpers are plain modules, imported by name (never from a conftest):

- tests.factories: users (factory_boy), jobs through the services (`make_job`,
  `job_in_state`), API and admin clients;
- tests.polling: `wait_for`, a condition polled until a deadline, failing loudly;
- tests.queues: the topology, queue depths and messages by raw AMQP;
- tests.processes: real workers, dispatchers and manage.py runs on the test database;
- tests.s3: an S3-compatible server (moto's, over HTTP) for the S3 artefact storage;
- tests.threads: `run_in_threads`, a race on purpose;
- tests.flush: what empties the tables after a transactional test;
- tests.handlers, tests.erp_receiver: what subprocesses run, an ERP stand-in.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from amqp.exceptions import NotAllowed
from django.conf import settings as django_settings
from kombu import Connection

from core.logging import formatter
from jobs.integrations import topology
from tests import flush, forkserver, testdb
from tests.factories import UserFactory, otp_login
from tests.queues import topology_declare_and_purge
from tests.s3 import S3Server, s3_server

# The modules that start real processes (Celery workers, dispatchers, gunicorn, Chromium)
# take longest. Under xdist (`--dist loadfile --no-loadscope-reorder`: modules handed out
# in collection order) they go first, so that the run never ends waiting on a long
# module that was started last (docs/development.md#parallel-test-workers); then the
# other modules of 10 s or more (`--durations=0` summed per module, make test on two
# cores): dlq/test_topology.py, handed out last, once kept one worker busy for 20 s
# after the three others had ended. A module missing here costs only that tail.
LONG_MODULES_FIRST = ("tests/e2e/", "tests/browser/")
LONG_MODULES_NEXT = tuple(
    f"tests/{module}.py"
    for module in (
        "test_settings",
        "test_portal_hostile_forms",
        "dlq/test_topology",
        "audit/test_db_roles",
        "audit/test_proofs",
        "jobs/test_webhooks",
        "audit/test_command",
        "jobs/test_liveness",
        "dlq/test_admin",
        "audit/test_archive",
        "client/test_client_live",
        "jobs/test_worker_tenancy_e2e",
        "jobs/test_erp_bridge",
        "jobs/test_dispatcher",
        "dlq/test_watcher",
        "jobs/test_job_stream",
        "dlq/test_api",
        "tenants/test_cross_tenant",
        "jobs/test_migrations",
        "jobs/test_brokerless",
    )
)


def _handed_out(item: pytest.Item) -> int:
    if item.nodeid.startswith(LONG_MODULES_FIRST):
        return 0
    return 1 if item.nodeid.startswith(LONG_MODULES_NEXT) else 2


@pytest.hookimpl(trylast=True)  # after pytest-django's order, which it keeps within each
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=_handed_out)


# What a session leaves behind is removed when it ends: the Redis keys it made, and an
# xdist worker's own vhost (docs/development.md#parallel-test-workers). A broker that
# had collected thirty leftover vhosts stopped answering handshakes.
REDIS_KEYS_BEFORE = pytest.StashKey[set[bytes]]()


def pytest_sessionstart(session: pytest.Session) -> None:
    """An xdist worker's vhost (config/settings_test.py names it) is created the first
    time that worker runs on this broker; an existing one (left by a run that was
    killed) is used as it is. The keys already in the session's Redis db are noted."""
    if _derives_its_own_services(session):
        _vhost_ensure(django_settings.BROKER_URL)
    if not _xdist_controller(session):
        keys = _redis_keys()
        if keys is not None:
            session.config.stash[REDIS_KEYS_BEFORE] = keys


def pytest_sessionfinish(session: pytest.Session) -> None:
    """After every fixture's teardown (the workers, dispatchers and servers the tests
    started are stopped): delete the Redis keys this session made (not the ones that
    were there before it) and, in an xdist worker, the vhost its settings derived for it
    (`<vhost>_gwN`). A plain `pytest` runs on the environment's vhost: never deleted."""
    before = session.config.stash.get(REDIS_KEYS_BEFORE, None)
    if before is not None:
        _redis_delete_keys_made_since(before)
    if _derives_its_own_services(session):
        _vhost_delete(django_settings.BROKER_URL)


def _derives_its_own_services(session: pytest.Session) -> bool:
    """An xdist worker whose settings derived its vhost and Redis db in this process
    (not a pytest a test started, which inherits its parent's)."""
    return hasattr(session.config, "workerinput") and bool(
        getattr(django_settings, "TEST_XDIST_DERIVED", False)
    )


def _xdist_controller(session: pytest.Session) -> bool:
    """The process that hands modules to xdist workers: it runs no test of its own."""
    workers = getattr(session.config.option, "numprocesses", None)
    return bool(workers) and not hasattr(session.config, "workerinput")


def _vhost_ensure(url: str) -> None:
    try:
        with Connection(url, connect_timeout=10) as conn:
            conn.connect()
        return
    except NotAllowed:  # "vhost ... not found"
        pass
    vhost, user = _vhost_and_user(url)
    for args in (["add_vhost", vhost], ["set_permissions", "-p", vhost, user, ".*", ".*", ".*"]):
        subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=120)


def _vhost_delete(url: str) -> None:
    """Best effort: a vhost left behind costs the broker, not this run's verdict, so a
    failure to delete it is said on stderr rather than failing a green session."""
    vhost, _user = _vhost_and_user(url)
    try:
        done = subprocess.run(
            ["rabbitmqctl", "-q", "delete_vhost", vhost],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"\ntest session: vhost {vhost} not deleted: {exc!r}", file=sys.stderr)
        return
    if done.returncode != 0 and "does not exist" not in done.stdout + done.stderr:
        print(
            f"\ntest session: rabbitmqctl delete_vhost {vhost}: {done.stdout}{done.stderr}",
            file=sys.stderr,
        )


def _vhost_and_user(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return unquote(parts.path[1:]), unquote(parts.username or "guest")


def _redis_keys() -> set[bytes] | None:
    """Every key in the session's Redis db; None without Redis (JOBOPS_REDIS off, or
    none answering: a session that needs it fails in its tests, not here)."""
    if not django_settings.JOBOPS_REDIS:
        return None
    from redis import RedisError

    from core.kv import redis_client

    try:
        return set(redis_client().scan_iter(count=1000))
    except RedisError:
        return None


def _redis_delete_keys_made_since(before: set[bytes]) -> None:
    from core.kv import redis_client

    made = sorted((_redis_keys() or set()) - before)
    for start in range(0, len(made), 500):
        redis_client().delete(*made[start : start + 500])


@pytest.fixture(scope="session")
def django_db_setup(
    request: pytest.FixtureRequest,
    django_test_environment: None,
    django_db_blocker: Any,
    django_db_keepdb: bool,
    django_db_createdb: bool,
    django_db_modify_db_settings: None,
) -> Iterator[None]:
    """pytest-django's, but the session's database is a copy of a template migrated
    once (tests/testdb.py; docs/development.md#the-test-database), not migrated anew
    by each xdist worker."""
    from django.db import connection

    keepdb = django_db_keepdb and not django_db_createdb
    original = connection.settings_dict["NAME"]
    name = connection.creation._get_test_db_name()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    base = name.removesuffix(f"_{worker}") if worker else name
    verbosity = request.config.option.verbose
    with django_db_blocker.unblock():
        template = testdb.ensure_template(connection, base, verbosity=verbosity)
        testdb.create_from_template(connection, name, template, keepdb=keepdb)
    yield
    if not keepdb:
        with django_db_blocker.unblock():
            testdb.destroy(connection, name, original)


@pytest.fixture(autouse=True, scope="session")
def _flush_after_transactional_tests() -> Iterator[None]:
    """After a transactional test, tests/flush.py empties the tables the test filled
    (Django's flush only where content types or permissions changed); the append-only
    tables' triggers are disabled for that TRUNCATE alone."""
    with flush.installed():
        yield


@pytest.fixture(autouse=True, scope="session")
def _fork_server() -> Iterator[None]:
    """The fork server (tests/forkserver.py) ends with the session, before coverage
    combines the data files of this run's processes."""
    yield
    forkserver.server.close()


@pytest.fixture
def broker() -> Iterator[None]:
    """The topology of docs/architecture.md declared in this run's vhost, every queue of it
    purged before and after the test."""
    topology_declare_and_purge()
    yield
    topology_declare_and_purge()


@pytest.fixture
def amqp(broker: None) -> Iterator[Any]:
    """A raw py-amqp channel on BROKER_URL (the vhost of this run), topology in place."""
    with Connection(django_settings.BROKER_URL, connect_timeout=10) as conn:
        yield conn.channel()


@pytest.fixture
def erp_queues(broker: None, settings: Any) -> Iterator[None]:
    """An ERP configured: the topology with its queues (erp.events and the bridge's
    parked queue), both empty, deleted afterwards so that no other test's events pile
    up in them; fast bridge timings."""
    settings.JOBOPS_ERP_EVENTS_URL = "http://erp.invalid/events"
    settings.JOBOPS_ERP_BRIDGE_BACKOFF_SECONDS = 0.05
    settings.JOBOPS_ERP_BRIDGE_BACKOFF_CAP_SECONDS = 0.2
    settings.JOBOPS_ERP_BRIDGE_TIMEOUT_SECONDS = 0.5
    queues = topology.erp_queues()
    with Connection(django_settings.BROKER_URL, connect_timeout=10) as conn:
        for queue in queues:
            queue(conn.channel()).declare()
            queue(conn.channel()).purge()
    yield
    with Connection(django_settings.BROKER_URL, connect_timeout=10) as conn:
        for queue in queues:
            queue(conn.channel()).delete()


@pytest.fixture
def json_log_lines() -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """Every log line of this process from here on, rendered by the production JSON
    chain (core/logging.py) with the context bound at the time; call it to read them."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter(json=True))
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture
def otp_admin_client(client):
    """A client logged in as a superuser whose session passed OTP verification."""
    user = UserFactory(username="otp-admin", is_staff=True, is_superuser=True)
    otp_login(client, user)
    client.user = user
    return client


@pytest.fixture(scope="session")
def s3_session() -> Iterator[S3Server]:
    """One S3-compatible server (moto's, its own process) for the run, started by the
    first test that asks for it."""
    with s3_server() as server:
        yield server


@pytest.fixture
def s3(s3_session: S3Server, settings: Any, monkeypatch: Any) -> S3Server:
    """This process's artefacts in the S3 server's bucket (ARTEFACT_STORAGE=s3), as a
    process started with `s3.env()` has them."""
    from config.settings import artefact_storage_config

    for name, value in s3_session.env().items():
        monkeypatch.setenv(name, value)
        if name.startswith("ARTEFACT_"):
            setattr(settings, name, value)
    settings.STORAGES = {
        **settings.STORAGES,
        "artefacts": artefact_storage_config(
            "s3",
            bucket=s3_session.bucket,
            endpoint_url=s3_session.endpoint_url,
            region=settings.ARTEFACT_S3_REGION,
        ),
    }
    return s3_session
