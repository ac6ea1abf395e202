"""The restore drill (docs/operations/backups.md#the-restore-drill).

A live system's database is dumped (`pg_dump -Fc`) while jobs wait `queued` on the
broker; the broker then loses its messages, and the dump is restored into a new
database. There `verify_audit_chain` finds every chain and checkpoint intact, and a
dispatcher started with `--republish-queued` beside a worker runs each job that was
queued at dump time exactly once.
"""

from __future__ import annotations

import subprocess
import uuid
from typing import Any

import psycopg
import pytest
from django.db import connection

from audit.checkpoints import checkpoint_write
from jobs.services import publish_due_once
from tests.factories import job_in_state, make_job
from tests.polling import wait_for
from tests.processes import (
    celery_worker,
    database_url,
    dispatcher_process,
    run_manage,
    subprocess_env,
)
from tests.queues import topology_declare_and_purge

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]


def _run(*args: str) -> None:
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{args[0]} exited {done.returncode}:\n{done.stderr}"


def _admin(statement: str) -> None:
    """CREATE or DROP DATABASE: outside a transaction, from the maintenance database."""
    with psycopg.connect(database_url(NAME="postgres"), autocommit=True) as admin:
        admin.execute(statement)


def _rows(url: str, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(statement, params).fetchall()


def test_a_restored_dump_verifies_and_runs_each_job_queued_at_dump_time_once(tmp_path):
    topology_declare_and_purge()
    ended = [job_in_state(status) for status in ("succeeded", "failed", "cancelled")]
    queued = [make_job(params={"steps": 2, "step_seconds": 0}) for _ in range(3)]
    ids = [job.id for job in queued]
    assert publish_due_once(pending_after=0) == 3  # confirmed; no worker consumes them
    assert checkpoint_write() is not None  # a signed checkpoint the restore must keep
    dump = tmp_path / "jobops.dump"
    _run("pg_dump", "--format=custom", f"--file={dump}", f"--dbname={database_url()}")
    topology_declare_and_purge()  # the broker lost every message

    restored = f"{connection.settings_dict['NAME']}_restored_{uuid.uuid4().hex[:8]}"
    url = database_url(NAME=restored)
    _admin(f'CREATE DATABASE "{restored}"')
    try:
        _run("pg_restore", "--exit-on-error", f"--dbname={url}", str(dump))
        env = {"DATABASE_URL": url}
        verified = run_manage("verify_audit_chain", env=subprocess_env(**env))
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert (
            _rows(url, "SELECT status FROM jobs WHERE id = ANY(%s) ORDER BY created_at", ids)
            == [("queued",)] * 3
        )
        with (
            dispatcher_process(env=env, extra_args=["--republish-queued"]),
            celery_worker(queues=["sim"], env=env),
        ):
            wait_for(
                lambda: _rows(url, "SELECT DISTINCT status FROM jobs WHERE id = ANY(%s)", ids)
                == [("succeeded",)],
                timeout=40,
                what="each job queued at dump time to succeed in the restored database",
            )
        runs = _rows(
            url,
            "SELECT j.id, j.attempts, count(*) FILTER (WHERE a.event_type = 'started') "
            "FROM jobs j JOIN audit_logs a ON a.job_id = j.id WHERE j.id = ANY(%s) "
            "GROUP BY j.id, j.attempts",
            ids,
        )
        assert sorted(runs) == sorted((job_id, 1, 1) for job_id in ids)  # once each
        ended_now = _rows(
            url, "SELECT id, status FROM jobs WHERE id = ANY(%s)", [j.id for j in ended]
        )
        assert dict(ended_now) == {job.id: job.status for job in ended}
        again = run_manage("verify_audit_chain", env=subprocess_env(**env))
        assert again.returncode == 0, again.stdout + again.stderr
    finally:
        _admin(f'DROP DATABASE IF EXISTS "{restored}" WITH (FORCE)')
