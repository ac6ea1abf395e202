"""Fixtures for the audit tests: realistic job histories and superuser tampering."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection, transaction

from audit.services import Actor
from jobs.services import Fence, job_claim, job_succeed, transition
from jobs.states import Status
from tests.factories import make_job

ROOT = Path(__file__).resolve().parents[2]
SYSTEM = Actor.system()


def job_with_history(*, succeed: bool = True):
    """A job through the real services: created, queued, started[, succeeded] (seq 1..4)."""
    job = make_job()
    # In a transactional test the publisher may already have moved it to `queued`
    # on commit (broker up); either way the chain is the same four events.
    job.refresh_from_db()
    if job.status == Status.PENDING:
        transition(job_id=job.id, target=Status.QUEUED, actor=SYSTEM)
    claimed = job_claim(job_id=job.id, locked_by="worker-1")
    assert claimed is not None
    if succeed:
        fence = Fence(locked_by="worker-1", attempt=claimed.attempts)
        job_succeed(job_id=job.id, fence=fence, result={"ok": True})
    return job


def tamper(sql: str, params: list | tuple = ()) -> None:
    """Change audit history as the database superuser would.

    The user triggers are disabled for this one transaction only, then re-enabled
    before it commits, exactly as an attacker holding the superuser role could.
    """
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("ALTER TABLE audit_logs DISABLE TRIGGER USER")
        cursor.execute("ALTER TABLE audit_checkpoints DISABLE TRIGGER USER")
        cursor.execute(sql, params)
        cursor.execute("ALTER TABLE audit_logs ENABLE TRIGGER USER")
        cursor.execute("ALTER TABLE audit_checkpoints ENABLE TRIGGER USER")


def database_url() -> str:
    """The test database (pytest-django's), for subprocesses that must see its data."""
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def run_manage(*args: str) -> subprocess.CompletedProcess[str]:
    """Run manage.py as a real process against the test database (data must be committed)."""
    env = {**os.environ, "DATABASE_URL": database_url()}
    env.pop("DJANGO_SETTINGS_MODULE", None)  # manage.py's own default, as an operator runs it
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def history():
    return job_with_history()
