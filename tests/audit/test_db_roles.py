"""The documented role setup: an owner that runs migrations, an app role that cannot
rewrite the audit trail; and production refuses to run as a privileged role."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import uuid

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, transaction

from audit.db_roles import database_role_problems
from audit.models import AuditLog
from audit.services import OPS_CHAIN, Actor, audit_append
from audit.verification import audit_verify
from tests.factories import job_in_state, make_job
from tests.processes import (
    PRODUCTION_SAFE,
    ROOT,
    celery_worker,
    database_url,
    run_python,
    subprocess_env,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def roles():
    suffix = uuid.uuid4().hex[:8]
    owner, app = f"jobops_owner_{suffix}", f"jobops_app_{suffix}"
    job_in_state("succeeded")
    out = io.StringIO()
    call_command("setup_db_roles", "--owner", owner, "--app", app, "--apply", stdout=out)
    assert "ALTER DEFAULT PRIVILEGES" in out.getvalue()
    try:
        yield owner, app
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET ROLE")
            cursor.execute(f"REASSIGN OWNED BY {owner} TO CURRENT_USER")
            for role in (owner, app):
                cursor.execute(f"DROP OWNED BY {role}")
                cursor.execute(f"DROP ROLE {role}")


def _as(role: str) -> psycopg.Connection:
    url = database_url(USER=role, PASSWORD="")
    return psycopg.connect(url, autocommit=True)


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE audit_logs SET event_type = 'forged'",
        "DELETE FROM audit_logs",
        "TRUNCATE audit_logs",
        "DELETE FROM audit_checkpoints",
        "ALTER TABLE audit_logs DISABLE TRIGGER USER",
        "SET session_replication_role = replica",
        "ALTER TABLE jobs OWNER TO CURRENT_USER",
    ],
)
def test_the_app_role_cannot_rewrite_history_or_switch_triggers_off(roles, statement):
    _, app = roles
    with _as(app) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(statement)
    assert AuditLog.objects.count() == 4


def test_the_app_role_runs_the_application(roles):
    """Jobs, audit appends and checkpoints all work as the app role."""
    _, app = roles
    with connection.cursor() as cursor:
        cursor.execute(f"SET ROLE {app}")
    try:
        assert database_role_problems() == []
        make_job()
        with transaction.atomic():
            audit_append(chain=OPS_CHAIN, event_type="dlq_discarded", actor=Actor.system())
        from audit.checkpoints import checkpoint_write

        assert checkpoint_write() is not None
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET ROLE")
    assert audit_verify().ok


def test_privileged_roles_are_named(roles):
    owner, _ = roles
    assert any("superuser" in p for p in database_role_problems())  # the test's own role
    with connection.cursor() as cursor:
        cursor.execute(f"SET ROLE {owner}")
    try:
        assert any("owns audit_logs" in p for p in database_role_problems())
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET ROLE")


PRODUCTION = {**PRODUCTION_SAFE, "DJANGO_SETTINGS_MODULE": "config.settings"}


def _boot_web(**extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **PRODUCTION, "DATABASE_URL": database_url(), **extra}
    return run_python("import config.wsgi; print('started')", env=env)


def test_production_refuses_to_start_as_a_superuser():
    refused = _boot_web()
    assert refused.returncode != 0
    assert "Refusing to start with DEBUG off" in refused.stderr and "superuser" in refused.stderr
    allowed = _boot_web(JOBOPS_DB_ALLOW_PRIVILEGED="true")
    assert allowed.returncode == 0 and "started" in allowed.stdout, allowed.stderr


def test_production_web_still_starts_while_the_database_is_unreachable():
    """The role check must not turn a database outage at boot into a web that cannot
    start (the API answers 503 while the database is down); each new process, e.g.
    the next gunicorn worker, checks again."""
    down = "postgres://postgres@127.0.0.1:1/jobops_unreachable"
    started = _boot_web(DATABASE_URL=down)
    assert started.returncode == 0 and "started" in started.stdout, started.stderr
    assert "could not check the database role" in started.stdout + started.stderr


def test_production_starts_as_the_app_role(roles):
    _, app = roles
    url = database_url(USER=app, PASSWORD="")
    started = _boot_web(DATABASE_URL=url)
    assert started.returncode == 0 and "started" in started.stdout, started.stderr


def _boot_worker(**extra: str) -> tuple[int | None, str]:
    """Start a real worker in production mode; (exit status or None if still running
    after the timeout, its output)."""
    env = {**subprocess_env(), **PRODUCTION, **extra}
    env.pop("JOBOPS_METRICS_PORT", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", "default",
         "--prefetch-multiplier", "1", "-P", "solo", "-n", f"refuse-{uuid.uuid4().hex[:8]}@%h",
         "-l", "info"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        return None, out
    return proc.returncode, out


def test_production_worker_refuses_to_start_as_a_superuser():
    """Celery swallows an Exception raised by a worker_init receiver: the refusal must
    really stop the worker, before it consumes anything."""
    status, out = _boot_worker()
    assert status not in (None, 0), out
    assert "Refusing to start with DEBUG off" in out and "superuser" in out
    assert " ready." not in out


def test_production_worker_starts_as_a_superuser_only_when_allowed(broker):
    with celery_worker(
        queues=["default"], env={**PRODUCTION, "JOBOPS_DB_ALLOW_PRIVILEGED": "true"}
    ) as worker:
        assert worker.alive()
    assert "Refusing to start" not in worker.log_text()


def test_the_owner_role_runs_migrations_including_the_audit_triggers(roles):
    """`migrate` runs as the owner: it must own the trigger functions too, or a
    migration that replaces or drops one fails with 'must be owner of function'."""
    owner, app = roles
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT pg_get_userbyid(proowner) FROM pg_proc "
            "WHERE proname LIKE 'jobops\\_%%'"
        )
        assert [r[0] for r in cursor.fetchall()] == [owner]
        cursor.execute(f"SET ROLE {owner}")
    try:
        call_command("migrate", "audit", "0002", verbosity=0)
        call_command("migrate", "audit", verbosity=0)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET ROLE")
        # Back to audit 0002 took dlq's migrations that depend on audit 0003 back too, and
        # `migrate audit` does not apply them again: without this the next tests of this
        # session ran on a schema that is not current, whose SQL files post_migrate then
        # leaves uninstalled (0008's body of audit_entry_payload stayed).
        call_command("migrate", verbosity=0)
    # The re-created trigger still refuses an insert out of order, as the app role.
    with _as(app) as conn, pytest.raises(psycopg.errors.IntegrityConstraintViolation):
        conn.execute(
            "INSERT INTO audit_logs (chain, seq, event_type, actor_type, actor_id, ts, "
            "payload, prev_hash, chain_hash, part) VALUES ('ops', 7, 'x', 'system', 'x', now(), "
            "'{}', repeat('0', 64), repeat('f', 64), audit_part_for_other(now()))"
        )
