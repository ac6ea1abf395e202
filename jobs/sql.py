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

import functools

# --- conditions, written once ----------------------------------------------------------

# The worker that claimed this attempt still holds the job (docs/architecture.md).
WORKER_HOLDS_LOCK = (
    "jobs.status = 'running' AND jobs.locked_by = %(locked_by)s AND jobs.attempts = %(attempt)s"
)
# A running job whose worker stopped heartbeating `stale_after` seconds ago (reaper),
# by the database clock so that hosts with skewed clocks agree.
LOCK_IS_STALE = "jobs.locked_at < now() - make_interval(secs => %(stale_after)s)"
# A claim may take pending and queued jobs at once, a retrying one only when it is due.
RETRY_IS_DUE = "(jobs.status <> 'retrying' OR jobs.next_run_at <= now())"
# Progress never goes back within an attempt, even when two writes cross
# (docs/architecture.md). Each claim starts the next attempt's progress from zero
# (SET_CLAIM), and a write of an earlier attempt is fenced out, so the maximum is
# always this attempt's.
MONOTONIC_PERCENT = "GREATEST(jobs.progress_percent, %(percent)s)"


# --- the job-chain append: every change of a job and its audit entry, one statement -----

# Who holds the checkpoint barrier (audit.services.CHECKPOINT_BARRIER) in shared mode:
# every append, so that a checkpoint (exclusive) never skips an entry in flight.
BARRIER = "pg_advisory_xact_lock_shared(hashtextextended(%(barrier)s, 0))"

# What fills each hole of an entry's canonical payload (audit.canonical.Hole), read
# from the locked row (`jobs` in the `old` CTE) as it was before the change.
HOLES = {
    "seq": "(jobs.audit_seq + 1)::text",
    "from": "jobs.status",
    "attempt": "(jobs.attempts + %(attempt_inc)s)::text",
    "percent": "GREATEST(jobs.progress_percent, %(percent)s)::text",
}
# The entry's hash: sha256(previous head bytes + payload bytes), as audit.canonical.
CHAIN_HASH = (
    "encode(sha256(decode(old.audit_head, 'hex') || convert_to(old.payload, 'UTF8')), 'hex')"
)


@functools.lru_cache(maxsize=256)
def job_append_sql(
    *,
    holes: tuple[str, ...],
    assignments: tuple[str, ...],
    conditions: tuple[str, ...],
    columns: tuple[str, ...],
    emit: bool,
    notify: bool = False,
    single: bool = False,
) -> str:
    """One statement that changes jobs and appends each one's audit entry (and event).

    1. `old`: the compare-and-set (`conditions`; zero rows: nothing is written). Lock
       the jobs that meet them (`FOR UPDATE`, in id order so that batches never
       deadlock; under READ COMMITTED a row changed meanwhile is locked in its newest
       version and checked again) and take the checkpoint barrier; build each entry's
       payload from its template pieces (`%(p0)s`..., one array element per job) and
       `holes` (HOLES, in template order), from the row as it is before the change.
    2. `upd`: the UPDATE of the locked rows by primary key (nobody can change them in
       between), which also moves the chain's head (audit_seq, audit_head) on the row.
       The conditions stay out of it: with them the planner may scan a partial index
       (the running jobs' one, with every dead entry) instead of the one-row lookup.
    3. `audit`: the entry, continuing the head the row held (the insert-at-head trigger
       checks it again); `outbox` (with `emit`): the job.status.changed event; with
       `notify`, NOTIFY jobs_pending (the jobs wait to be published).
    Returns each changed job's previous status, then its `columns`. Built once per
    combination of options (cached: the callers' fragments are constants).

    With `single`, `i` is one row of scalar parameters instead of arrays. A worker's
    claim and finish are one job each, and they run most often: PostgreSQL then knows
    `i` is one row without seeing the values, so the prepared statement keeps one
    generic plan (primary-key lookups) instead of being planned anew on every
    execution, which cost more than running it (a generic plan estimates an array
    parameter's unnest at 10 rows, and a custom plan wins that comparison).
    """
    names = [f"p{n}" for n in range(len(holes) + 1)]
    if single:
        rows = "SELECT %(ids)s::uuid AS id, " + ", ".join(f"%({p})s::text AS {p}" for p in names)
    else:
        # Arrays travel in binary (`%()b`): psycopg's text format escapes every element
        # in Python, 16 ms for a publish batch's 500 pieces against 0.7 ms in binary.
        arrays = ", ".join(f"%({p})b::text[]" for p in names)
        rows = (
            f"SELECT * FROM unnest(%(ids)b::text[]::uuid[], {arrays}) AS i(id, {', '.join(names)})"
        )
    payload = " || ".join(
        part
        for n, hole in enumerate([*holes, None])
        for part in ([f"i.p{n}"] + ([HOLES[hole]] if hole else []))
    )
    sets = ", ".join(
        [
            *assignments,
            "audit_seq = jobs.audit_seq + 1",
            f"audit_head = {CHAIN_HASH}",
        ]
    )
    where = " AND ".join(conditions) or "true"
    returned = ", ".join(f"upd.{c}" for c in columns)
    emit_cte = (
        ", outbox AS (INSERT INTO event_outbox (event_id, job_id, seq, payload, created_at) "
        "SELECT u.eid, u.id, u.audit_seq, jsonb_build_object("
        "'event_id', u.eid::text, 'type', 'job.status.changed', 'job_id', u.id::text, "
        "'job_type', u.type, 'seq', u.audit_seq, 'status', u.status, "
        "'previous_status', u.old_status, 'progress', u.progress_percent, "
        "'attempt', u.attempts, 'timestamp', %(ts_text)s::text, "
        "'request_id', u.request_id, 'correlation_id', u.correlation_id), now() "
        # A volatile call in a subquery's select list runs once per row: one id each.
        "FROM (SELECT upd.*, gen_random_uuid() AS eid FROM upd) u)"
        if emit
        else ""
    )
    return (
        f"WITH i AS ({rows}), "
        "old AS (SELECT jobs.id, jobs.status, jobs.audit_head, "
        f"{payload} AS payload FROM jobs JOIN i ON i.id = jobs.id CROSS JOIN {BARRIER} "
        f"WHERE {where} ORDER BY jobs.id FOR UPDATE OF jobs), "
        f"upd AS (UPDATE jobs SET {sets} FROM old WHERE jobs.id = old.id RETURNING "
        "old.status AS old_status, old.audit_head AS prev_hash, old.payload AS payload, "
        f"{', '.join(f'jobs.{c}' for c in columns)}), "
        "audit AS (INSERT INTO audit_logs (chain, job_id, seq, event_type, actor_type, "
        "actor_id, ts, payload, prev_hash, chain_hash) SELECT 'job:' || upd.id::text, "
        "upd.id, upd.audit_seq, %(event_type)s, %(actor_type)s, %(actor_id)s, %(ts)s, "
        "upd.payload, upd.prev_hash, upd.audit_head FROM upd)"
        f"{emit_cte} SELECT upd.old_status, {returned} FROM upd"
        + (
            f" CROSS JOIN LATERAL (SELECT {NOTIFY_PENDING} WHERE upd.id IS NOT NULL) n"
            if notify
            else ""
        )
    )


@functools.lru_cache(maxsize=4)
def job_insert_sql(*, columns: tuple[str, ...]) -> str:
    """Create a job (docs/architecture.md) in one statement, atomic by itself.

    The INSERT (`ON CONFLICT DO NOTHING`: an idempotency key already taken inserts
    nothing, and the caller reads the existing job), the `created` entry (seq 1, its
    hash computed by the caller: nothing of it is left for the database to fill), the
    outbox event, and `NOTIFY jobs_pending`, which wakes the dispatcher to publish it
    (delivered on commit). Returns the id when the job was inserted.
    """
    values = ", ".join(f"%(c_{c})s" for c in columns)
    return (
        f"WITH ins AS (INSERT INTO jobs ({', '.join(columns)}) VALUES ({values}) "
        "ON CONFLICT DO NOTHING RETURNING id), "
        "audit AS (INSERT INTO audit_logs (chain, job_id, seq, event_type, actor_type, "
        "actor_id, ts, payload, prev_hash, chain_hash) SELECT 'job:' || ins.id::text, ins.id, "
        "1, 'created', %(actor_type)s, %(actor_id)s, %(ts)s, %(payload)s, %(prev_hash)s, "
        f"%(chain_hash)s FROM ins CROSS JOIN {BARRIER}), "
        "outbox AS (INSERT INTO event_outbox (event_id, job_id, seq, payload, created_at) "
        "SELECT %(event_id)s, ins.id, 1, %(event)s, now() FROM ins) "
        f"SELECT ins.id FROM ins CROSS JOIN LATERAL (SELECT {NOTIFY_PENDING}) AS n"
    )


# --- reads of the API's hot path ------------------------------------------------------

# The caller may see the job: its owner, or staff (docs/api.md: anyone else gets 404).
VISIBLE_TO_CALLER = "(%(staff)s OR jobs.owner_id = %(owner)s)"

# A conditional GET needs only the version (the ETag): one index probe, no body.
JOB_VERSION = "SELECT jobs.version FROM jobs WHERE jobs.id = %(job_id)s AND " + VISIBLE_TO_CALLER


# Which job a read finds: by id, if the caller may see it; or the job an owner made
# under an idempotency key (jobs_owner_idempotency_uniq).
JOB_BY_ID = "jobs.id = %(job_id)s AND " + VISIBLE_TO_CALLER
JOB_BY_OWNER_KEY = "jobs.owner_id = %(owner)s AND jobs.idempotency_key = %(key)s"


@functools.lru_cache(maxsize=4)
def job_read_sql(*, columns: str, where: str = JOB_BY_ID) -> str:
    """The job as the API shows it, in one statement: its `columns`, then its artefacts
    as one JSON array in the body's order (kind, name); no row when `where` (JOB_BY_ID
    or JOB_BY_OWNER_KEY) finds none."""
    return (
        f"SELECT {columns}, (SELECT coalesce(json_agg(json_build_object("
        "'id', a.id, 'kind', a.kind, 'name', a.name, 'content_type', a.content_type, "
        "'file', a.file, 'sha256', a.sha256, 'size', a.size) ORDER BY a.kind, a.name), '[]') "
        "FROM artefacts a WHERE a.job_id = jobs.id) "
        f"FROM jobs WHERE {where}"
    )


# Wakes the dispatchers (LISTEN jobs_pending): a job waits to be published. Delivered on
# commit; identical notifications of one transaction arrive once.
PENDING_CHANNEL = "jobs_pending"
NOTIFY_PENDING = f"pg_notify('{PENDING_CHANNEL}', '')"

# A transition's compare-and-set: only from the allowed source states.
STATUS_IN_SOURCES = "jobs.status = ANY(%(sources)s)"
SET_STATUS = ["status = %(target)s", "version = jobs.version + 1", "updated_at = now()"]
SET_VERSION = ["version = jobs.version + 1", "updated_at = now()"]
SET_CANCEL_REQUESTED = ["cancel_requested = true", *SET_VERSION]
# Raising the flag is a change only for a job that has not ended and was not flagged yet.
CANCEL_NOT_REQUESTED = (
    "jobs.cancel_requested = false AND jobs.status NOT IN ('succeeded', 'failed', 'cancelled')"
)


# Assignments a transition may make, by named option of `transition()`.
SET_CLAIM = [
    "locked_by = %(claim_for)s",
    "locked_at = now()",
    "attempts = jobs.attempts + 1",
    "next_run_at = NULL",
    # Progress belongs to an attempt: a retry or a reclaimed job starts from zero, not
    # from the 99 % its last attempt reached before the time limit or a lost worker.
    "progress_percent = 0",
    "progress_step = NULL",
    "progress_message = NULL",
    "progress_updated_at = NULL",
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

# worker_lock: lock the job row for a fenced write beside it (an artefact), or nothing.
WORKER_LOCK = "SELECT 1 FROM jobs WHERE id = %(job_id)s AND " + WORKER_HOLDS_LOCK + " FOR UPDATE"

# lock_is_stale: whether a running job's lock is stale now, by the database clock.
LOCK_IS_STALE_NOW = "SELECT " + LOCK_IS_STALE + " FROM jobs WHERE id = %(job_id)s"


# --- dispatcher ---------------------------------------------------------------------------


# due_jobs: a publish batch of `status` rows that are due (pending: created before
# `before`; retrying: next_run_at before `before`), oldest first, skipping rows another
# dispatcher holds and rows backing off. Served by jobs_pending_idx / jobs_retry_due_idx.
@functools.lru_cache(maxsize=4)
def due_jobs_sql(*, status: str, columns: str) -> str:
    order = {"pending": "created_at", "retrying": "next_run_at"}[status]
    return (
        f"SELECT {columns} FROM jobs WHERE status = '{status}' AND {order} <= %(before)s "
        f"AND id <> ALL(%(skip)s::uuid[]) ORDER BY {order} LIMIT %(limit)s "
        "FOR UPDATE SKIP LOCKED"
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
# claim (in flight in another relay); our rows at or above it must wait, so that a
# job's events leave in seq order (jobs/events.py). Only ids below the claim's highest
# can block: a job's rows take ids in seq order. That bound keeps the scan to the part
# of outbox_unpublished_idx the claim has just walked, instead of every unpublished row
# behind it (a backlog was read whole again for each batch).
OUTBOX_BLOCKERS = (
    "SELECT job_id, min(seq) FROM event_outbox "
    "WHERE published_at IS NULL AND id < %(below)s AND job_id = ANY(%(job_ids)b::uuid[]) "
    "AND NOT (id = ANY(%(ids)b::bigint[])) "
    "GROUP BY job_id"
)


# outbox_claim_plan: run first in each relay transaction. Marking a row published
# leaves its outbox_unpublished_idx entry behind until VACUUM. Only a plain index scan
# flags such entries dead as it passes them, so that the next claim skips them; the
# bitmap scan the planner picks for a LIMIT above its row estimate (always, with
# RELAY_BATCH) flags nothing, and every claim visited every row published since the last
# VACUUM: 4,000 heap tuples per claim after a 2,000-job drain, then 12 buffers instead.
OUTBOX_CLAIM_PLAN = "SET LOCAL enable_bitmapscan = off"

# outbox_claim: a relay's batch, unpublished rows in id order (outbox_unpublished_idx),
# rows another relay holds skipped; the payload as the JSON text stored, published as is.
OUTBOX_CLAIM = (
    "SELECT id, job_id, seq, event_id::text, payload::text FROM event_outbox "
    "WHERE published_at IS NULL ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED"
)

# outbox_mark: the claimed rows the broker confirmed, in the claim's transaction.
OUTBOX_MARK = "UPDATE event_outbox SET published_at = now() WHERE id = ANY(%(ids)b::bigint[])"


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
