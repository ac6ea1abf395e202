"""The jobs app's SQL statements (jobs/queries.sql), read once, and what they share
with Python."""

from __future__ import annotations

from pathlib import Path

from core.queries import load

QUERIES = load(Path(__file__).with_name("queries.sql"))

# The channel job_append and job_insert NOTIFY (literally, in jobs/queries.sql) when a
# job waits to be published; the dispatcher LISTENs on it. Delivered on commit;
# identical notifications of one transaction arrive once.
PENDING_CHANNEL = "jobs_pending"

# The values job_append can fill into an entry's payload (its `h0`..`h2`): the index
# of each in the statement's array of the locked row's values.
HOLE = {"seq": 1, "from": 2, "attempt": 3, "percent": 4, "context": 5}
