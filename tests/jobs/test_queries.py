"""The jobs app's statements (jobs/queries.sql) against what Python holds of them."""

from __future__ import annotations

import re

import pytest

from audit.queries import QUERIES as AUDIT_QUERIES
from core.sqlfiles import ROOT
from jobs.models import Job
from jobs.queries import PENDING_CHANNEL, QUERIES


@pytest.mark.parametrize("name", ["job_insert", "jobs_insert_batch"])
def test_the_job_insert_statements_name_every_column_of_the_job(name):
    """job_insert and jobs_insert_batch list the columns literally: a column added to
    the model must be added to the statements too."""
    columns = re.search(r"INSERT INTO jobs \((.*?)\)", QUERIES[name], re.S)
    assert columns is not None
    named = [c.strip() for c in columns.group(1).split(",")]
    assert sorted(named) == sorted(f.column for f in Job._meta.concrete_fields)


def test_the_dispatcher_listens_on_the_channel_the_statements_notify():
    assert QUERIES["listen_pending"] == f"LISTEN {PENDING_CHANNEL}"
    assert f"pg_notify('{PENDING_CHANNEL}', '')" in QUERIES["job_insert"]
    assert f"pg_notify('{PENDING_CHANNEL}', '')" in QUERIES["jobs_insert_batch"]
    transitions = (ROOT / "jobs" / "sql" / "20_transitions.sql").read_text(encoding="utf-8")
    assert f"pg_notify('{PENDING_CHANNEL}', '')" in transitions


def test_only_the_audit_app_writes_audit_logs():
    """The chain rule is audit_append's (audit/migrations/0004): no statement of jobs
    inserts into audit_logs or computes a chain hash of its own."""
    for sql in QUERIES.values():
        assert "INSERT INTO audit_logs" not in sql and "sha256(" not in sql
    for path in (ROOT / "jobs" / "sql").glob("*.sql"):
        text = path.read_text(encoding="utf-8")
        assert "INSERT INTO audit_logs" not in text and "sha256(" not in text
    entries = (ROOT / "jobs" / "sql" / "10_entries.sql").read_text(encoding="utf-8")
    assert "audit_append_job_entries(" in entries
    assert "audit_append_job_entries(" in QUERIES["job_insert"]
    assert "audit_append_entries(" in AUDIT_QUERIES["append"]
