"""The jobs app's statements (jobs/queries.sql) against what Python holds of them."""

from __future__ import annotations

import re

from audit.queries import QUERIES as AUDIT_QUERIES
from jobs.models import Job
from jobs.queries import PENDING_CHANNEL, QUERIES


def test_the_job_insert_statement_names_every_column_of_the_job():
    """job_insert lists the columns literally: a column added to the model must be added
    to the statement too."""
    columns = re.search(r"INSERT INTO jobs \((.*?)\)", QUERIES["job_insert"], re.S)
    assert columns is not None
    named = [c.strip() for c in columns.group(1).split(",")]
    assert sorted(named) == sorted(f.column for f in Job._meta.concrete_fields)


def test_the_dispatcher_listens_on_the_channel_the_statements_notify():
    assert QUERIES["listen_pending"] == f"LISTEN {PENDING_CHANNEL}"
    for name in ("job_append", "job_insert"):
        assert f"pg_notify('{PENDING_CHANNEL}', '')" in QUERIES[name]


def test_only_the_audit_app_writes_audit_logs():
    """The chain rule is audit_append's (audit/migrations/0004): no statement of jobs
    inserts into audit_logs or computes a chain hash of its own."""
    for sql in QUERIES.values():
        assert "INSERT INTO audit_logs" not in sql and "sha256(" not in sql
    assert "audit_append(" in QUERIES["job_append"] and "audit_append(" in QUERIES["job_insert"]
    assert "audit_append(" in AUDIT_QUERIES["append"]
