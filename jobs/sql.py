"""Every raw SQL statement of the jobs app, each named and described once.

The ORM writes what it can; these are the statements it cannot express as one round
trip: compare-and-set transitions with RETURNING, `FOR UPDATE SKIP LOCKED` claims,
monotonic progress. Conditions that several statements share (the worker still holds
the lock; the lock is stale; a retry is due) are written once, as fragments, and every
statement that needs them is built from them here, never in a caller. Parameters are
always named (`%(name)s`) and passed as values: nothing a caller or client sends
becomes SQL text.
"""

from __future__ import annotations

# --- conditions, written once ----------------------------------------------------------

# The worker that claimed this attempt still holds the job (DESIGN.md 3.4 fencing).
WORKER_HOLDS_LOCK = (
    "jobs.status = 'running' AND jobs.locked_by = %(locked_by)s AND jobs.attempts = %(attempt)s"
)
# A running job whose worker stopped heartbeating `stale_after` seconds ago (reaper),
# by the database clock so that hosts with skewed clocks agree.
LOCK_IS_STALE = "jobs.locked_at < now() - make_interval(secs => %(stale_after)s)"
# A claim may take pending and queued jobs at once, a retrying one only when it is due.
RETRY_IS_DUE = "(jobs.status <> 'retrying' OR jobs.next_run_at <= now())"
# Progress never goes back, even when two writes cross (DESIGN.md 3.8).
MONOTONIC_PERCENT = "GREATEST(jobs.progress_percent, %(percent)s)"


# --- transition: the one compare-and-set of DESIGN.md 3.4 -------------------------------


def transition_sql(*, assignments: list[str], conditions: list[str], columns: list[str]) -> str:
    """`UPDATE jobs` for one transition: status IN sources plus `conditions`.

    The FOR UPDATE subquery locks the row first and reads the status this UPDATE
    replaces, so the result names the previous status (the audit entry's `from`).
    Returns `old.status` and then the job's `columns` (in the model's order, which the
    table's may not be). `assignments` and `conditions` are fragments of this module,
    chosen by `jobs.services.transitions`.
    """
    sets = ", ".join(
        ["status = %(target)s", "version = jobs.version + 1", "updated_at = now()", *assignments]
    )
    where = " AND ".join(["jobs.id = old.id", "jobs.status = ANY(%(sources)s)", *conditions])
    return (
        f"UPDATE jobs SET {sets} "
        "FROM (SELECT id, status FROM jobs WHERE id = %(job_id)s FOR UPDATE) AS old "
        f"WHERE {where} RETURNING old.status, {', '.join(f'jobs.{c}' for c in columns)}"
    )


# Assignments a transition may make, by named option of `transition()`.
SET_CLAIM = [
    "locked_by = %(claim_for)s",
    "locked_at = now()",
    "attempts = jobs.attempts + 1",
    "next_run_at = NULL",
]
SET_UNLOCK = ["locked_by = NULL", "locked_at = NULL"]
SET_RUN_IN = ["next_run_at = now() + make_interval(secs => %(run_in)s)"]
SET_PROGRESS = [
    f"progress_percent = {MONOTONIC_PERCENT}",
    "progress_step = %(step)s",
    "progress_message = %(message)s",
    "progress_updated_at = now()",
]
SET_PROGRESS_COMPLETE = ["progress_percent = 100", "progress_updated_at = now()"]
SET_EXTEND_ATTEMPTS = ["max_attempts = jobs.max_attempts + %(extend_attempts)s"]


# --- worker writes that change no status --------------------------------------------------

# heartbeat: refresh the lock; no `version` bump (a client sees no change). Returns the
# cancel flag, so the heartbeat also brings cancellation to the worker.
HEARTBEAT = (
    "UPDATE jobs SET locked_at = now() WHERE id = %(job_id)s AND "
    + WORKER_HOLDS_LOCK
    + " RETURNING cancel_requested"
)

# progress_write: one coalesced progress value, fenced; bumps `version` (the ETag moves).
PROGRESS_WRITE = (
    "UPDATE jobs SET "
    + ", ".join(SET_PROGRESS)
    + ", version = jobs.version + 1, updated_at = now() WHERE id = %(job_id)s AND "
    + WORKER_HOLDS_LOCK
    + " RETURNING progress_percent"
)

# worker_lock: lock the job row for a fenced write beside it (an artefact), or nothing.
WORKER_LOCK = "SELECT 1 FROM jobs WHERE id = %(job_id)s AND " + WORKER_HOLDS_LOCK + " FOR UPDATE"

# lock_is_stale: whether a running job's lock is stale now, by the database clock.
LOCK_IS_STALE_NOW = "SELECT " + LOCK_IS_STALE + " FROM jobs WHERE id = %(job_id)s"


# --- dispatcher ---------------------------------------------------------------------------

# due_pending: the oldest pending job the request path did not publish (older than
# `after` seconds), skipping rows another dispatcher holds and rows backing off.
# Served by jobs_pending_idx.
DUE_PENDING = (
    "SELECT id, type FROM jobs WHERE status = 'pending' "
    "AND created_at < now() - make_interval(secs => %(after)s) "
    "AND id <> ALL(%(skip)s::uuid[]) ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED"
)

# due_retrying: the retry that came due first (jobs_retry_due_idx), same rules.
DUE_RETRYING = (
    "SELECT id, type FROM jobs WHERE status = 'retrying' AND next_run_at <= now() "
    "AND id <> ALL(%(skip)s::uuid[]) ORDER BY next_run_at LIMIT 1 FOR UPDATE SKIP LOCKED"
)

# stale_locks: running jobs whose lock went stale (jobs_running_lock_idx), for the reaper;
# each is then re-checked inside its own compare-and-set.
STALE_LOCKS = (
    "SELECT id, attempts, max_attempts FROM jobs WHERE status = 'running' AND "
    + LOCK_IS_STALE
    + " ORDER BY locked_at LIMIT %(limit)s"
)


# --- event outbox -------------------------------------------------------------------------

# outbox_blockers: the lowest unpublished seq per job among rows this relay did not
# claim (in flight in another relay, or beyond this claim's LIMIT); our rows at or above
# it must wait, so that a job's events leave in seq order (jobs/events.py).
OUTBOX_BLOCKERS = (
    "SELECT job_id, min(seq) FROM event_outbox "
    "WHERE published_at IS NULL AND job_id = ANY(%(job_ids)s) AND NOT (id = ANY(%(ids)s)) "
    "GROUP BY job_id"
)


# --- gauges (jobs/metrics.py) -------------------------------------------------------------

# gauges: the oldest pending job, stale locks, outbox lag and backlog, and the newest
# checkpoint, in one statement; each part is served by a partial index
# (jobs_pending_idx, jobs_running_lock_idx, outbox_unpublished_idx) or reads one row,
# so a scrape stays cheap on a large table.
GAUGES = (
    "SELECT"
    " (SELECT EXTRACT(EPOCH FROM now() - min(created_at)) FROM jobs WHERE status = 'pending'),"
    " (SELECT count(*) FROM jobs WHERE status = 'running' AND " + LOCK_IS_STALE + "),"
    " (SELECT EXTRACT(EPOCH FROM now() - min(created_at)) FROM event_outbox"
    "   WHERE published_at IS NULL),"
    " (SELECT count(*) FROM event_outbox WHERE published_at IS NULL),"
    " (SELECT EXTRACT(EPOCH FROM now() - max(created_at)) FROM audit_checkpoints)"
)

# dead_letters_open: open dead letters per DLQ (dl_open_queue_code_idx).
DEAD_LETTERS_OPEN = "SELECT queue, count(*) FROM dead_letters WHERE state = 'open' GROUP BY queue"


# --- operator dashboard (jobs/selectors.py) ------------------------------------------------

# queue_unfinished: per queue and status, the jobs not yet ended, with the queue's oldest
# pending job, its running jobs whose lock is stale, and its retries already due. Served
# by jobs_unfinished_idx (partial: only unfinished jobs, however many have
# ended).
QUEUE_UNFINISHED = (
    "SELECT queue, status, count(*),"
    " EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE status = 'pending')),"
    " count(*) FILTER (WHERE status = 'running' AND " + LOCK_IS_STALE + "),"
    " count(*) FILTER (WHERE status = 'retrying' AND next_run_at <= now())"
    " FROM jobs WHERE status IN ('pending', 'queued', 'running', 'retrying')"
    " GROUP BY queue, status"
)
# queue_finished_since: per queue and status, jobs created in the last `hours` that
# ended (jobs_created_idx: a range of the newest rows, not the whole table).
QUEUE_FINISHED_SINCE = (
    "SELECT queue, status, count(*) FROM jobs"
    " WHERE created_at >= now() - make_interval(hours => %(hours)s)"
    " AND status IN ('succeeded', 'failed', 'cancelled')"
    " GROUP BY queue, status"
)


# --- audit verification (jobs/audit_checks.py) ---------------------------------------------

# status_against_chain: jobs whose status is not the one their chain's last transition
# leads to. `{scope}` is one of the STATUS_SCOPE_* fragments below.
STATUS_AGAINST_CHAIN = """
SELECT j.id::text, j.status, last.event_type, last.seq
FROM jobs j
LEFT JOIN LATERAL (
    SELECT a.event_type, a.seq FROM audit_logs a
    WHERE a.chain = 'job:' || j.id::text AND a.event_type = ANY(%(events)s)
    ORDER BY a.seq DESC LIMIT 1
) last ON true
LEFT JOIN unnest(%(events)s::text[], %(statuses)s::text[]) AS m(event, status)
    ON m.event = last.event_type
WHERE m.status IS DISTINCT FROM j.status {scope}
ORDER BY j.id
LIMIT %(limit)s
"""
# uuid[] rather than id::text: the primary key index serves `--job` lookups.
STATUS_SCOPE_ALL = ""
STATUS_SCOPE_CHAINS = "AND j.id = ANY(%(ids)s::uuid[])"
STATUS_SCOPE_SINCE = "AND (j.id = ANY(%(ids)s::uuid[]) OR j.updated_at >= %(since)s)"
STATUS_SCOPE_SINCE_REQUESTED = STATUS_SCOPE_SINCE + " AND j.id = ANY(%(requested)s::uuid[])"
