"""The jobs app's SQL statements (jobs/queries.sql), read once, and what they share
with Python."""

from __future__ import annotations

from pathlib import Path

from core.queries import load

QUERIES = load(Path(__file__).with_name("queries.sql"))

# The channel job_insert (jobs/queries.sql) and the transitions back to `pending` or a
# claim (jobs/sql/20_transitions.sql) NOTIFY, literally, when a job waits to be
# published; the dispatcher LISTENs on it. Delivered on commit; identical notifications
# of one transaction arrive once.
PENDING_CHANNEL = "jobs_pending"
