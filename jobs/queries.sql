-- Every SQL statement of the jobs app, named and described (core/queries.py).
--
-- The ORM writes what it can; these are the statements it cannot express as one round
-- trip: compare-and-set transitions with RETURNING, FOR UPDATE SKIP LOCKED claims,
-- monotonic progress. A variant is a parameter (NULL or false: that part does
-- nothing) or a statement of its own, never text assembled at run time. Parameters are
-- always named and passed as values: nothing a caller or client sends becomes SQL.
-- A job's audit entry is appended by the audit app's audit_append
-- (audit/sql/append.sql), in the same statement as the change it records. A job's
-- changes are the functions of jobs/sql/20_transitions.sql, one per kind.


-- name: job_insert
-- Creates a job (docs/architecture.md#creation-and-idempotency) in one statement,
-- atomic by itself: the INSERT (ON CONFLICT DO NOTHING: an idempotency key already
-- taken inserts nothing, and the caller reads the existing job), its `created` entry
-- (seq 1, its payload composed by jobs_entry_payload, as every other entry of a job's,
-- from the job's values and `entry`, the caller's data; the row's audit_head is its
-- hash) through
-- audit_append_job_entries, in the partition of the job's month (audit_part,
-- audit_part_for_job of its created_at), the outbox event (none where JOBOPS_EVENTS_PUBLISH is off:
-- jobs_events_on), and NOTIFY jobs_pending, which wakes the dispatcher
-- to publish it (delivered on commit). Returns the id and audit_head when the job was
-- inserted. Every column of the job is named (tests/jobs/test_queries.py pins the
-- list against the model).
WITH entry AS (
    SELECT jobs_entry_payload(
        %(id)s::uuid, 1, %(correlation_id)s::text, %(type)s::text, %(org_id)s::bigint,
        %(project_id)s::bigint,
        jsonb_build_object('from', NULL, 'to', %(status)s::text, 'attempt', %(attempts)s::int)
            || %(entry)s::jsonb,
        'created', %(actor_type)s::text, %(actor_id)s::text, %(ts_text)s::text,
        %(entry_request_id)s::text
    ) AS payload
),
ins AS (
    INSERT INTO jobs (
        id, type, category, queue, params, params_hash, status, idempotency_key,
        idempotency_expires_at, idempotency_last_seen_at, cancel_requested, attempts,
        max_attempts,
        progress_percent, progress_step, progress_message, progress_updated_at,
        progress_metrics,
        last_error_code, last_error_message, result, locked_by, locked_at, next_run_at,
        dead_letter_queue, request_id, correlation_id, version, created_at, updated_at,
        owner_id, traceparent, audit_head, audit_seq, org_id, project_id, run_at,
        rerun_of_id, priority, audit_part
    ) VALUES (
        %(id)s, %(type)s, %(category)s, %(queue)s, %(params)s, %(params_hash)s,
        %(status)s, %(idempotency_key)s, %(idempotency_expires_at)s,
        %(idempotency_last_seen_at)s, %(cancel_requested)s, %(attempts)s, %(max_attempts)s, %(progress_percent)s, %(progress_step)s,
        %(progress_message)s, %(progress_updated_at)s, %(progress_metrics)s,
        %(last_error_code)s,
        %(last_error_message)s, %(result)s, %(locked_by)s, %(locked_at)s,
        %(next_run_at)s, %(dead_letter_queue)s, %(request_id)s, %(correlation_id)s,
        %(version)s, %(created_at)s, %(updated_at)s, %(owner_id)s, %(traceparent)s,
        (SELECT audit_chain_hash(%(prev_hash)s::text, entry.payload) FROM entry), %(audit_seq)s, %(org_id)s, %(project_id)s, %(run_at)s,
        %(rerun_of_id)s, %(priority)s, audit_part_for_job(%(created_at)s::timestamptz)
    )
    ON CONFLICT DO NOTHING
    RETURNING jobs AS job
),
outbox AS (
    INSERT INTO event_outbox (event_id, job_id, seq, payload, created_at)
    SELECT %(event_id)s::uuid, (ins.job).id, 1,
           jobs_status_event(ins.job, %(event_id)s::uuid, NULL, %(ts_text)s::text), now()
    FROM ins WHERE jobs_events_on()
)
SELECT (ins.job).id, (ins.job).audit_head
FROM ins
CROSS JOIN entry
CROSS JOIN LATERAL audit_append_job_entries(
    ARRAY[(ins.job).id], ARRAY[(ins.job).audit_part], ARRAY[1::bigint],
    ARRAY[entry.payload], ARRAY[%(prev_hash)s::text], 'created', %(actor_type)s::text,
    %(actor_id)s::text, %(ts)s::timestamptz
) AS appended
CROSS JOIN LATERAL (SELECT pg_notify('jobs_pending', '')) AS wake;


-- name: jobs_insert_batch
-- A batch create (docs/api.md#creating-jobs-in-a-batch) in one statement: what
-- job_insert does for one job, for every row of `rows` (a JSON array of job rows, each
-- column by name, as jobs.services.batch_creation writes them). ON CONFLICT DO
-- NOTHING: a row whose idempotency key is taken inserts nothing, and the caller reads
-- the existing job. Each inserted job gets its `created` entry (seq 1, composed by
-- jobs_entry_payload as job_insert's; audit_head its hash) through the set-based
-- audit_append_job_entries, and its outbox event; NOTIFY jobs_pending is sent once,
-- when anything was inserted. Returns the id of each inserted job. Every column of the
-- job is named (tests/jobs/test_queries.py pins the list against the model).
WITH input AS (
    SELECT r.*, jobs_entry_payload(
        r.id, 1, r.correlation_id, r.type, r.org_id, r.project_id,
        jsonb_build_object('from', NULL, 'to', r.status, 'attempt', r.attempts),
        'created', %(actor_type)s::text, %(actor_id)s::text, %(ts_text)s::text,
        %(entry_request_id)s::text
    ) AS payload, gen_random_uuid() AS event_id
    FROM jsonb_populate_recordset(NULL::jobs, %(rows)s::jsonb) WITH ORDINALITY AS r
),
ins AS (
    INSERT INTO jobs (
        id, type, category, queue, params, params_hash, status, idempotency_key,
        idempotency_expires_at, idempotency_last_seen_at, cancel_requested, attempts,
        max_attempts,
        progress_percent, progress_step, progress_message, progress_updated_at,
        progress_metrics,
        last_error_code, last_error_message, result, locked_by, locked_at, next_run_at,
        dead_letter_queue, request_id, correlation_id, version, created_at, updated_at,
        owner_id, traceparent, audit_head, audit_seq, org_id, project_id, run_at,
        rerun_of_id, priority, audit_part
    )
    SELECT
        id, type, category, queue, params, params_hash, status, idempotency_key,
        idempotency_expires_at, idempotency_last_seen_at, cancel_requested, attempts,
        max_attempts,
        progress_percent, progress_step, progress_message, progress_updated_at,
        progress_metrics,
        last_error_code, last_error_message, result, locked_by, locked_at, next_run_at,
        dead_letter_queue, request_id, correlation_id, version, created_at, updated_at,
        owner_id, traceparent, audit_chain_hash(%(prev_hash)s::text, payload), 1, org_id,
        project_id, run_at, rerun_of_id, priority, audit_part_for_job(created_at)
    FROM input ORDER BY ordinality
    ON CONFLICT DO NOTHING
    RETURNING jobs AS job
),
outbox AS (
    INSERT INTO event_outbox (event_id, job_id, seq, payload, created_at)
    SELECT input.event_id, (ins.job).id, 1,
           jobs_status_event(ins.job, input.event_id, NULL, %(ts_text)s::text), now()
    FROM ins JOIN input ON input.id = (ins.job).id
),
appended AS (
    SELECT audit_append_job_entries(
        array_agg(input.id ORDER BY input.ordinality),
        array_agg((ins.job).audit_part ORDER BY input.ordinality),
        array_agg(1::bigint ORDER BY input.ordinality),
        array_agg(input.payload ORDER BY input.ordinality),
        array_agg(%(prev_hash)s::text ORDER BY input.ordinality),
        'created', %(actor_type)s::text, %(actor_id)s::text, %(ts)s::timestamptz
    ) AS count
    FROM ins JOIN input ON input.id = (ins.job).id
),
wake AS (
    SELECT pg_notify('jobs_pending', '') FROM (SELECT FROM ins LIMIT 1) AS any_inserted
)
SELECT (ins.job).id
FROM ins
CROSS JOIN appended
LEFT JOIN LATERAL (SELECT count(*) FROM wake) AS woken ON true;


-- name: jobs_repeat_by_keys
-- job_repeat_by_key for the keys of a batch that inserted nothing: for each (org,
-- key) of `orgs` and `keys` (element i with element i), the job `owner` made under it,
-- in one statement, and the same "seen" write for a repeat within its TTL at `now`
-- with its params_hash and project (`hashes`, `projects`, element i). Returns id,
-- org_id, idempotency_key, params_hash, project_id and idempotency_expires_at of each
-- job found. The "seen" write skips a
-- row another transaction holds: concurrent batches repeating the same keys in other
-- orders would otherwise lock them in other orders and deadlock, and a mark to the
-- second that a concurrent repeat is writing too loses nothing.
WITH wanted AS (
    SELECT * FROM unnest(%(orgs)s::bigint[], %(keys)s::text[], %(hashes)s::text[],
                         %(projects)s::bigint[])
        AS w(org_id, key, params_hash, project_id)
),
seen AS (
    UPDATE jobs SET idempotency_last_seen_at = %(now)s
    WHERE jobs.id IN (
        SELECT jobs.id FROM jobs JOIN wanted
          ON jobs.org_id = wanted.org_id AND jobs.owner_id = %(owner)s
         AND jobs.idempotency_key = wanted.key
        WHERE jobs.idempotency_expires_at > %(now)s
          AND jobs.params_hash = wanted.params_hash
          AND jobs.project_id IS NOT DISTINCT FROM wanted.project_id
          AND (jobs.idempotency_last_seen_at IS NULL
               OR jobs.idempotency_last_seen_at <= %(now)s - interval '1 second')
        FOR UPDATE OF jobs SKIP LOCKED
    )
)
SELECT jobs.id, jobs.org_id, jobs.idempotency_key, jobs.params_hash, jobs.project_id,
       jobs.idempotency_expires_at
FROM jobs JOIN wanted
  ON jobs.org_id = wanted.org_id AND jobs.owner_id = %(owner)s
 AND jobs.idempotency_key = wanted.key;


-- name: jobs_created_actor_types
-- Who made each job of `ids`: the actor type of its `created` entry (seq 1 of its
-- chain), for the message's `actor_type` (jobs.integrations.publisher). One probe of
-- the (chain, seq) unique index a job, one round trip a publish batch. A job whose
-- entry is gone (purged with an archive) is simply absent.
SELECT job_id, actor_type FROM audit_logs
WHERE chain = ANY(ARRAY(SELECT audit_job_chain(i) FROM unnest(%(ids)s::uuid[]) AS i))
  AND seq = 1;


-- name: job_version
-- A conditional GET needs only the version (the ETag): one index probe, no body. The
-- caller may see the job (tenants.selectors.Viewer): every job; every job of the
-- organisations in `orgs` (a limited operator); through a membership of the job's
-- organisation, its own job, or any job of an organisation it administers or that shares
-- visibility (memberships_uniq serves the probe). Anyone else gets 404.
SELECT jobs.version FROM jobs
WHERE jobs.id = %(job_id)s AND (%(everything)s OR jobs.org_id = ANY(%(orgs)s::bigint[])
    OR EXISTS (SELECT FROM memberships m JOIN organisations o ON o.id = m.organisation_id
               WHERE m.user_id = %(owner)s AND m.organisation_id = jobs.org_id
                 AND (jobs.owner_id = %(owner)s OR m.role = 'admin' OR o.shared_visibility)));


-- name: job_read
-- The job as the API shows it, if the caller may see it (as job_version): its row, then
-- its artefacts as one JSON array in the body's order (jobs_artefacts_json,
-- jobs/sql/artefacts.sql).
SELECT jobs.*, jobs_artefacts_json(jobs.id) AS artefacts
FROM jobs WHERE jobs.id = %(job_id)s AND (%(everything)s OR jobs.org_id = ANY(%(orgs)s::bigint[])
    OR EXISTS (SELECT FROM memberships m JOIN organisations o ON o.id = m.organisation_id
               WHERE m.user_id = %(owner)s AND m.organisation_id = jobs.org_id
                 AND (jobs.owner_id = %(owner)s OR m.role = 'admin' OR o.shared_visibility)));


-- name: job_repeat_by_key
-- job_read for the job an owner made under an idempotency key in an organisation
-- (jobs_org_owner_idempotency_uniq): what a repeated create answers. In the same round
-- trip, a repeat (the key within its TTL at `now`, the same params_hash and project) moves the key
-- record's last seen to `now` (docs/api.md#idempotency; the application's clock, as
-- created_at, its first seen), to the second: a repeat within a second of the last one
-- writes nothing. A write is a commit to flush, which made a repeat 2.4 times as slow
-- (1.5 to 3.6 ms); a client retrying in a loop, or many at once, now flushes once a
-- second. Nothing else moves, and no version: the body does not show last seen, so a
-- client's ETag stays valid. The row read is the one before that write (a statement's
-- CTE writes are not visible to its own query).
WITH seen AS (
    UPDATE jobs SET idempotency_last_seen_at = %(now)s
    WHERE jobs.org_id = %(org)s AND jobs.owner_id = %(owner)s AND jobs.idempotency_key = %(key)s
      AND jobs.idempotency_expires_at > %(now)s AND jobs.params_hash = %(params_hash)s
      AND jobs.project_id IS NOT DISTINCT FROM %(project)s::bigint
      AND (jobs.idempotency_last_seen_at IS NULL
           OR jobs.idempotency_last_seen_at <= %(now)s - interval '1 second')
)
SELECT jobs.*, jobs_artefacts_json(jobs.id) AS artefacts
FROM jobs
WHERE jobs.org_id = %(org)s AND jobs.owner_id = %(owner)s AND jobs.idempotency_key = %(key)s;


-- name: keys_release_due
-- A batch of idempotency keys past their TTL at `before` (jobs_key_expiry_idx, oldest
-- first), rows another transaction holds skipped, released: a create with the key
-- makes a new job. The key leaves the job's body, so version and updated_at move
-- (a new ETag; a client's cached 304 cannot hide the change). Returns the jobs' ids.
WITH due AS (
    SELECT id FROM jobs
    WHERE idempotency_key IS NOT NULL AND idempotency_expires_at <= %(before)s
    ORDER BY idempotency_expires_at LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs SET idempotency_key = NULL, idempotency_expires_at = NULL,
    idempotency_last_seen_at = NULL, version = jobs.version + 1, updated_at = now()
FROM due WHERE jobs.id = due.id
RETURNING jobs.id;


-- name: key_release
-- keys_release_due for one job (a create found its key past the TTL at `before`), by
-- primary key: waits for the row rather than skipping it, so the caller knows.
UPDATE jobs SET idempotency_key = NULL, idempotency_expires_at = NULL,
    idempotency_last_seen_at = NULL, version = jobs.version + 1, updated_at = now()
WHERE id = %(job_id)s AND idempotency_key IS NOT NULL
  AND idempotency_expires_at <= %(before)s
RETURNING jobs.id;


-- name: heartbeat
-- Refreshes the locks of the jobs `ids` (each with its holder in `locked_by` and its
-- attempt in `attempts`: a Celery worker's one job, or every job a run_worker host
-- holds) while each holder still holds that attempt; no version bump (a client sees no
-- change). Returns each job still held with its cancel flag, so the heartbeat also
-- brings cancellation to the worker; a job not returned was lost.
UPDATE jobs SET locked_at = now()
FROM unnest(%(ids)s::uuid[], %(locked_by)s::text[], %(attempts)s::int[])
    AS h(id, locked_by, attempt)
WHERE jobs.id = h.id AND jobs.status = 'running'
  AND jobs.locked_by = h.locked_by AND jobs.attempts = h.attempt
RETURNING jobs.id, jobs.cancel_requested;


-- name: claimable_jobs
-- The postgres executor's claim (docs/postgres-executor.md): up to `limit` jobs of the
-- `queues` that may run now, locked for the caller's transaction, which then claims
-- them with jobs_claim_polled (jobs/sql/20_transitions.sql: its compare-and-set, the `started` entries and
-- events). Highest priority first, then oldest, over each queue's `pending` jobs
-- (jobs_pending_priority_idx, one ordered probe per queue, stopping at the LIMIT) and
-- its due `retrying` jobs (jobs_retry_due_idx; retries are few); rows another claimer
-- holds are skipped. Never a job of a paused queue (queue_pauses), of a suspended
-- organisation, or of a type in `skip_types` (its connector's breaker is open). A
-- scheduled job becomes pending through the dispatcher first.
SELECT c.id FROM (
    SELECT d.id, d.priority, d.created_at FROM unnest(%(queues)s::text[]) AS q(queue)
    CROSS JOIN LATERAL (
        SELECT jobs.id, jobs.priority, jobs.created_at FROM jobs
        WHERE jobs.status = 'pending' AND jobs.queue = q.queue
          AND jobs.type <> ALL(%(skip_types)s::text[])
          AND NOT EXISTS (
              SELECT FROM organisations o WHERE o.id = jobs.org_id AND o.suspended_at IS NOT NULL)
        ORDER BY jobs.priority DESC, jobs.created_at
        LIMIT %(limit)s::int
        FOR UPDATE OF jobs SKIP LOCKED
    ) AS d
    WHERE NOT EXISTS (SELECT FROM queue_pauses p WHERE p.queue = q.queue)
    UNION ALL
    SELECT r.id, r.priority, r.created_at FROM (
        SELECT jobs.id, jobs.priority, jobs.created_at FROM jobs
        WHERE jobs.status = 'retrying' AND jobs.next_run_at <= now()
          AND jobs.queue = ANY(%(queues)s::text[]) AND jobs.type <> ALL(%(skip_types)s::text[])
          AND NOT EXISTS (
              SELECT FROM organisations o WHERE o.id = jobs.org_id AND o.suspended_at IS NOT NULL)
          AND NOT EXISTS (SELECT FROM queue_pauses p WHERE p.queue = jobs.queue)
        ORDER BY jobs.next_run_at
        LIMIT %(limit)s::int
        FOR UPDATE OF jobs SKIP LOCKED
    ) AS r
) AS c
ORDER BY c.priority DESC, c.created_at
LIMIT %(limit)s::int;


-- name: next_retry_due
-- Seconds until the earliest retry of the `queues` comes due (NULL: none waits), so
-- that run_worker sleeps no longer than until then: jobs_retry_due_idx in order.
SELECT EXTRACT(EPOCH FROM min(next_run_at) - now())::float8 FROM jobs
WHERE status = 'retrying' AND queue = ANY(%(queues)s::text[]);


-- name: worker_lock
-- Locks the job row for a fenced write beside it (an artefact), or finds nothing when
-- the worker no longer holds this attempt.
SELECT 1 FROM jobs
WHERE id = %(job_id)s AND jobs.status = 'running'
  AND jobs.locked_by = %(locked_by)s AND jobs.attempts = %(attempt)s
FOR UPDATE;


-- name: lock_is_stale
-- Whether a running job's lock is older than `stale_after` seconds now, by the database
-- clock, so that hosts with skewed clocks agree (as jobs_reclaim's `p_stale_after`).
SELECT jobs.locked_at < now() - make_interval(secs => %(stale_after)s)
FROM jobs WHERE id = %(job_id)s;


-- name: due_pending_jobs
-- A publish batch of pending jobs created before `before`, per queue as many as its
-- broker window has room for (docs/operator-controls.md#priority): `window` less the
-- queue's `queued` jobs (published, not yet claimed: what the broker holds for it),
-- each queue's jobs highest priority first, then oldest, skipping rows another
-- dispatcher holds, the ids in `skip` (backing off), the jobs of suspended
-- organisations (held until `resume`: docs/tenancy.md#suspension) and every job of a
-- paused queue (queue_pauses: jobs.services.queues). At most `limit` rows in all.
--
-- `queues`: the queues that have pending jobs, found by a loose index scan (one probe
-- per queue, however long its backlog, of an index that leads with the queue: the
-- planner takes jobs_unfinished_idx). For each
-- live queue, `w` counts at most `window` of its queued jobs (jobs_unfinished_idx),
-- then one ordered scan of jobs_pending_priority_idx stops at the room's LIMIT (a
-- nested-loop anti join against the small organisations table keeps that order). A
-- paused queue is an anti join on queue_pauses before any of its rows is read, and so
-- is a queue in `skip_queues` (run by the postgres executor: never published).
WITH RECURSIVE queues AS (
    (SELECT queue FROM jobs WHERE status = 'pending' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM jobs j WHERE j.status = 'pending' AND j.queue > queues.queue
            ORDER BY j.queue LIMIT 1)
    FROM queues WHERE queues.queue IS NOT NULL
)
SELECT d.* FROM queues
CROSS JOIN LATERAL (
    SELECT %(window)s::int - count(*)::int AS room FROM (
        SELECT FROM jobs WHERE jobs.status = 'queued' AND jobs.queue = queues.queue
        LIMIT %(window)s::int) AS q
) AS w
CROSS JOIN LATERAL (
    SELECT jobs.* FROM jobs
    WHERE jobs.status = 'pending' AND jobs.queue = queues.queue
      AND jobs.created_at <= %(before)s AND jobs.id <> ALL(%(skip)s::uuid[])
      AND NOT EXISTS (
          SELECT FROM organisations o WHERE o.id = jobs.org_id AND o.suspended_at IS NOT NULL)
    ORDER BY jobs.priority DESC, jobs.created_at
    LIMIT least(w.room, %(limit)s::int)
    FOR UPDATE OF jobs SKIP LOCKED
) AS d
WHERE queues.queue IS NOT NULL AND w.room > 0
  AND queues.queue <> ALL(%(skip_queues)s::text[])
  AND NOT EXISTS (SELECT FROM queue_pauses p WHERE p.queue = queues.queue)
LIMIT %(limit)s;


-- name: due_retrying_jobs
-- due_pending_jobs for retrying jobs whose next_run_at is before `before`, oldest due
-- first (jobs_retry_due_idx); a suspended organisation's retries and a paused
-- queue's stay `retrying` and come due after `resume` (anti joins on the small
-- organisations and queue_pauses tables keep the index order). A retry is not held
-- to the window: it was in the broker once already, and retries are few. Never one of
-- `skip_queues` (the postgres executor's: run_worker claims them).
SELECT jobs.* FROM jobs
WHERE status = 'retrying' AND next_run_at <= %(before)s AND id <> ALL(%(skip)s::uuid[])
  AND queue <> ALL(%(skip_queues)s::text[])
  AND NOT EXISTS (
      SELECT FROM organisations o WHERE o.id = jobs.org_id AND o.suspended_at IS NOT NULL)
  AND NOT EXISTS (SELECT FROM queue_pauses p WHERE p.queue = jobs.queue)
ORDER BY next_run_at LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;


-- name: due_scheduled_jobs
-- A batch of scheduled jobs whose run_at has come by `now` (the application's clock,
-- as the run_at the API checked against it), earliest first, skipping rows another
-- dispatcher holds: the caller moves them to `pending` (audited `due`) in the same
-- transaction. jobs_scheduled_due_idx, in order, stopping at the LIMIT.
SELECT id FROM jobs
WHERE status = 'scheduled' AND run_at <= %(now)s
ORDER BY run_at LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;


-- name: next_scheduled_run
-- The earliest run_at of a scheduled job (NULL: none), so that the dispatcher sleeps
-- no longer than until then: one probe at the start of jobs_scheduled_due_idx.
SELECT min(run_at) FROM jobs WHERE status = 'scheduled';


-- name: stale_locks
-- Running jobs whose lock went stale (jobs_running_lock_idx), for the reaper; each is
-- then checked again inside its own compare-and-set.
SELECT id, attempts, max_attempts FROM jobs
WHERE status = 'running' AND locked_at < now() - make_interval(secs => %(stale_after)s)
ORDER BY locked_at LIMIT %(limit)s;


-- name: outbox_blockers
-- The lowest unpublished seq per job among rows this relay did not claim (in flight in
-- another relay); our rows at or above it must wait, so that a job's events leave in
-- seq order (jobs/events.py). Only ids below the claim's highest can block: a job's
-- rows take ids in seq order. That bound keeps the scan to the part of
-- outbox_waiting_idx the claim has just walked, instead of every unpublished row
-- behind it (a backlog was read whole again for each batch). A parked row (refused by
-- the ERP for good, jobs/erp_bridge.py) blocks nothing: the job's later events go on.
SELECT job_id, min(seq) FROM event_outbox
WHERE published_at IS NULL AND parked_at IS NULL
  AND id < %(below)s AND job_id = ANY(%(job_ids)b::uuid[])
  AND NOT (id = ANY(%(ids)b::bigint[]))
GROUP BY job_id;


-- name: outbox_claim_plan
-- Run first in each relay transaction. Marking a row published leaves its
-- outbox_waiting_idx entry behind until VACUUM. Only a plain index scan flags such
-- entries dead as it passes them, so that the next claim skips them; the bitmap scan
-- the planner picks for a LIMIT above its row estimate (always, with RELAY_BATCH) flags
-- nothing, and every claim visited every row published since the last VACUUM: 4,000
-- heap tuples per claim after a 2,000-job drain, then 12 buffers instead.
SET LOCAL enable_bitmapscan = off;


-- name: outbox_claim
-- A relay's batch: unpublished rows in id order (outbox_waiting_idx: parked rows are
-- not in it), rows another relay holds skipped; the payload as the JSON text stored,
-- published as is, and its type (the routing key: job.status.changed, job.progress).
SELECT id, job_id, seq, event_id::text, payload::text,
       coalesce(payload->>'type', 'job.status.changed') FROM event_outbox
WHERE published_at IS NULL AND parked_at IS NULL ORDER BY id LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;


-- name: outbox_mark
-- The claimed rows the broker confirmed, in the claim's transaction.
UPDATE event_outbox SET published_at = now() WHERE id = ANY(%(ids)b::bigint[]);


-- name: outbox_park
-- The claimed rows the ERP refused for good (the brokerless bridge, jobs/erp_bridge.py),
-- in the claim's transaction: each with the response's status and the start of its
-- text. They leave outbox_waiting_idx for outbox_parked_idx.
UPDATE event_outbox o SET parked_at = now(), park_status = p.status, park_text = p.text
FROM unnest(%(ids)s::bigint[], %(statuses)s::int[], %(texts)s::text[]) AS p(id, status, text)
WHERE o.id = p.id AND o.published_at IS NULL AND o.parked_at IS NULL
RETURNING o.id, o.event_id::text, o.job_id::text, o.seq, o.park_status;


-- name: outbox_parked_list
-- The parked rows, oldest first (outbox_parked_idx), for `manage.py erp_parked list`;
-- `after` pages on by id.
SELECT id, event_id::text, job_id::text, seq, created_at, parked_at, park_status, park_text,
       payload->>'status'
FROM event_outbox
WHERE published_at IS NULL AND parked_at IS NOT NULL AND id > %(after)s
ORDER BY id LIMIT %(limit)s;


-- name: outbox_find
-- Rows by event id (event_outbox's unique index), whatever their state, so that an
-- operator's command can tell an id it does not know from an event no longer parked.
SELECT event_id::text, parked_at IS NOT NULL AND published_at IS NULL
FROM event_outbox WHERE event_id = ANY(%(event_ids)s::uuid[]);


-- name: outbox_redrive
-- Compare-and-set: the parked rows among `event_ids` lose their park and wait for the
-- bridge again, in their id order (the same event_id: the same Idempotency-Key). A row
-- not parked any more (re-driven or discarded already) is not matched.
UPDATE event_outbox SET parked_at = NULL, park_status = NULL, park_text = NULL
WHERE event_id = ANY(%(event_ids)s::uuid[]) AND published_at IS NULL AND parked_at IS NOT NULL
RETURNING id, event_id::text, job_id::text, seq;


-- name: outbox_discard
-- Compare-and-set: the parked rows among `event_ids` are settled without delivery.
-- parked_at, the status and the text stay (what was refused, until the purge);
-- published_at hands the row to the retention of delivered rows (outbox_prune).
UPDATE event_outbox SET published_at = now()
WHERE event_id = ANY(%(event_ids)s::uuid[]) AND published_at IS NULL AND parked_at IS NOT NULL
RETURNING id, event_id::text, job_id::text, seq, park_status;


-- name: gauges
-- The oldest pending job, stale locks, outbox lag and backlog, the newest checkpoint
-- and the parked ERP events, in one statement (jobs/metrics.py); each part is served
-- by a partial index (jobs_pending_idx, jobs_running_lock_idx, outbox_waiting_idx,
-- outbox_parked_idx) or reads one row, so a scrape stays cheap on a large table. A
-- parked row waits for an operator, not for the relay: it is no part of the lag.
-- `priority >= 0` (true of every job) is jobs_pending_idx's predicate: only this
-- statement names it, so that the claims and the publisher cannot take that index
-- for theirs (jobs/migrations/0025).
SELECT
    (SELECT EXTRACT(EPOCH FROM now() - min(created_at)) FROM jobs
        WHERE status = 'pending' AND priority >= 0),
    (SELECT count(*) FROM jobs WHERE status = 'running'
        AND locked_at < now() - make_interval(secs => %(stale_after)s)),
    (SELECT EXTRACT(EPOCH FROM now() - min(created_at)) FROM event_outbox
        WHERE published_at IS NULL AND parked_at IS NULL),
    (SELECT count(*) FROM event_outbox WHERE published_at IS NULL AND parked_at IS NULL),
    (SELECT EXTRACT(EPOCH FROM now() - max(created_at)) FROM audit_checkpoints),
    (SELECT count(*) FROM event_outbox WHERE published_at IS NULL AND parked_at IS NOT NULL);


-- name: queues_paused
-- The paused queues (queue_pauses: a handful of rows at most), for the queue_paused gauge.
SELECT queue FROM queue_pauses;


-- name: dead_letters_open
-- Open dead letters per DLQ (dl_open_queue_code_idx).
SELECT queue, count(*) FROM dead_letters WHERE state = 'open' GROUP BY queue;


-- name: queue_unfinished
-- Per queue and status, the jobs not yet ended, with the queue's oldest pending job,
-- its running jobs whose lock is stale, and its retries already due. Served by
-- jobs_unfinished_idx (partial: only unfinished jobs, however many have ended).
SELECT queue, status, count(*),
    EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE status = 'pending')),
    count(*) FILTER (WHERE status = 'running'
        AND locked_at < now() - make_interval(secs => %(stale_after)s)),
    count(*) FILTER (WHERE status = 'retrying' AND next_run_at <= now())
FROM jobs WHERE status IN ('pending', 'queued', 'running', 'retrying')
  -- `orgs`: the organisations the dashboard is filtered to; NULL: all of them.
  AND (%(orgs)s::bigint[] IS NULL OR org_id = ANY(%(orgs)s::bigint[]))
GROUP BY queue, status;


-- name: queue_finished_since
-- Per queue and status, jobs created in the last `hours` that ended (jobs_created_idx:
-- a range of the newest rows, not the whole table).
SELECT queue, status, count(*) FROM jobs
WHERE created_at >= now() - make_interval(hours => %(hours)s)
  AND status IN ('succeeded', 'failed', 'cancelled')
  AND (%(orgs)s::bigint[] IS NULL OR org_id = ANY(%(orgs)s::bigint[]))
GROUP BY queue, status;


-- name: status_against_chain
-- Jobs whose status is not the one their chain's last transition leads to
-- (jobs/audit_checks.py): `events` and `statuses` pair each transition event with the
-- status it leads to. Which jobs: all when `ids` is NULL; else those of `ids` and,
-- with `since`, every job whose row changed since then; only those of `requested`
-- unless it is NULL. uuid[] rather than id::text: the primary key serves the lookup.
SELECT j.id::text, j.status, last.event_type, last.seq
FROM jobs j
LEFT JOIN LATERAL (
    SELECT a.event_type, a.seq,
           -- A `created` entry leads to the status it names: `pending`, or `scheduled`
           -- for a job created with a future run_at (parsed only for that one entry).
           CASE WHEN a.event_type = 'created' THEN a.payload::jsonb #>> '{data,to}' END
               AS created_to
    FROM audit_logs a
    WHERE a.chain = audit_job_chain(j.id) AND a.event_type = ANY(%(events)s)
    ORDER BY a.seq DESC LIMIT 1
) last ON true
LEFT JOIN unnest(%(events)s::text[], %(statuses)s::text[]) AS m(event, status)
    ON m.event = last.event_type
WHERE coalesce(last.created_to, m.status) IS DISTINCT FROM j.status
  AND (%(ids)s::uuid[] IS NULL OR j.id = ANY(%(ids)s::uuid[])
       OR j.updated_at >= %(since)s::timestamptz)
  AND (%(requested)s::uuid[] IS NULL OR j.id = ANY(%(requested)s::uuid[]))
ORDER BY j.id
LIMIT %(limit)s;


-- name: purge_claim
-- A purge batch (jobs/services/purge.py): ended jobs past their type's retention,
-- those that ended first first, locked for the batch's transaction, rows another
-- purger holds skipped. `types` and `keep` pair each job type with its retention in
-- seconds; a type not named is never purged. jobs_purge_due (jobs/migrations/0011,
-- 0023) is the rule: never an unfinished job, a job with an open dead letter, one
-- whose idempotency key is still live, or one with a fix-forward edit still undecided
-- (purge_kept says which). A job ended when its row last changed (updated_at; every
-- transition moves it): per type, one ordered scan of jobs_ended_idx over its jobs
-- that ended before its retention, stopping at the LIMIT, so a pass reads only jobs
-- past their retention, however many finished jobs of longer-kept types the table
-- holds (before, one walk over every job older than the shortest retention, the rule
-- called per row: seconds per pass beside a million jobs kept 90 days). The jobs that
-- stay there (an open dead letter, a live key) are walked past again by each batch.
-- Each type locks up to `limit` rows of its own; those past the batch's LIMIT are
-- released at its commit and taken by the next batch.
SELECT d.id, d.type, d.status
FROM unnest(%(types)s::text[], %(keep)s::float8[]) AS r(type, secs)
CROSS JOIN LATERAL (
    SELECT j.id, j.type, j.status, j.updated_at FROM jobs j
    WHERE j.type = r.type AND j.status IN ('succeeded', 'failed', 'cancelled')
      AND j.updated_at < now() - make_interval(secs => r.secs)
      AND jobs_purge_due(j, r.secs)
    ORDER BY j.updated_at
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
) AS d
ORDER BY d.updated_at
LIMIT %(limit)s;


-- name: purge_due_counts
-- What a purge would remove now, per job type (manage.py purge --dry-run): the jobs
-- purge_claim would take (same parameters and scan, no limit, nothing locked), with their
-- artefacts, closed dead letters, published outbox rows and (decided) fix-forward edits:
-- each counted once, through its own job.
SELECT j.type, count(*),
       coalesce(sum((SELECT count(*) FROM artefacts a WHERE a.job_id = j.id)), 0),
       coalesce(sum((SELECT count(*) FROM dead_letters d WHERE d.job_id = j.id)), 0),
       coalesce(sum((SELECT count(*) FROM event_outbox o
                     WHERE o.job_id = j.id AND o.published_at IS NOT NULL)), 0),
       coalesce(sum((SELECT count(*) FROM params_edits e WHERE e.job_id = j.id)), 0)
FROM unnest(%(types)s::text[], %(keep)s::float8[]) AS r(type, secs)
CROSS JOIN LATERAL (
    SELECT j.id, j.type FROM jobs j
    WHERE j.type = r.type AND j.status IN ('succeeded', 'failed', 'cancelled')
      AND j.updated_at < now() - make_interval(secs => r.secs)
      AND jobs_purge_due(j, r.secs)
    OFFSET 0  -- a subquery per type, not pulled up into one join: its own index range
) AS j
GROUP BY j.type;


-- name: purge_delete
-- Deletes the jobs `ids` (locked by purge_claim, their `purged` entries appended) with
-- their artefact rows, closed dead letters and published outbox rows, in one
-- statement; an unpublished outbox row stays for the relay (it names no row), and so
-- does a parked one, for the operator who re-drives or discards it. The
-- audit tables are not touched. Returns the counts and the artefacts' storage keys
-- (their files go after commit).
-- Every foreign key into these tables is handled here (jobs/services/purge.py
-- PURGE_FOREIGN_KEYS, which a test holds against pg_constraint): the keys are
-- DEFERRABLE INITIALLY DEFERRED, so one forgotten fails the whole batch at its commit.
-- - params_edits (job_id, and dead_letter_id: an edit names a dead letter of its own
--   job): a purged job's edits go with it; the rule let it through only with every
--   edit applied or rejected, a decision its chain holds (hashes and paths).
-- - jobs.rerun_of_id: a re-run that stays forgets its purged original; the link stays
--   in the re-run's `created` entry, which is hashed. Its body changes, so its version
--   moves (a new ETag); not updated_at, which says when it ended (its own retention).
--   A re-run purged in the same batch is not updated (a statement changes a row once).
WITH art AS (
    DELETE FROM artefacts WHERE job_id = ANY(%(ids)s::uuid[]) RETURNING file
),
edits AS (
    DELETE FROM params_edits WHERE job_id = ANY(%(ids)s::uuid[]) RETURNING id
),
dl AS (
    DELETE FROM dead_letters WHERE job_id = ANY(%(ids)s::uuid[]) AND state <> 'open'
    RETURNING id
),
outbox AS (
    DELETE FROM event_outbox
    WHERE job_id = ANY(%(ids)s::uuid[]) AND published_at IS NOT NULL
      -- nor one the webhook fan-out has yet to copy (jobs/processes/webhooks.py)
      AND NOT webhook_outbox_unread(txid, id)
    RETURNING id
),
unlinked AS (
    UPDATE jobs SET rerun_of_id = NULL, version = jobs.version + 1
    WHERE rerun_of_id = ANY(%(ids)s::uuid[]) AND id <> ALL(%(ids)s::uuid[])
    RETURNING id
),
gone AS (
    DELETE FROM jobs WHERE id = ANY(%(ids)s::uuid[]) RETURNING id
)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM dl), (SELECT count(*) FROM outbox),
       (SELECT count(*) FROM edits), (SELECT count(*) FROM unlinked),
       (SELECT coalesce(array_agg(file), '{}') FROM art);


-- name: purge_kept
-- The jobs purge keeps although their retention has passed and nothing else holds them
-- (jobs_purge_ended): a fix-forward edit of theirs waits for a decision
-- (jobs_purge_held), e.g. one whose dead letter was closed before closing a dead letter
-- settled its edit. Same parameters as purge_due_counts; the total (before the limit),
-- then the oldest `limit` with the dead letters of their waiting edits. Read from the
-- undecided edits' side (jobs_purge_held's condition; a handful of rows) and their jobs
-- by primary key: never a walk over the finished jobs, which a pass before this one
-- made every time (seconds beside a million jobs kept 90 days).
SELECT count(*) OVER (), j.id::text,
       (SELECT array_agg(e.dead_letter_id ORDER BY e.id) FROM params_edits e
        WHERE e.job_id = j.id AND e.state NOT IN ('applied', 'rejected'))
FROM jobs j
JOIN unnest(%(types)s::text[], %(keep)s::float8[]) AS r(type, secs) ON r.type = j.type
WHERE j.id IN (SELECT e.job_id FROM params_edits e WHERE e.state NOT IN ('applied', 'rejected'))
  AND jobs_purge_ended(j, r.secs) AND jobs_purge_held(j)
ORDER BY j.created_at
LIMIT %(limit)s;


-- name: chains_without_job
-- Job chains whose job row is missing although the chain does not end in `purged`
-- (jobs/audit_checks.py): a job deleted outside the purge. `ids` NULL: every job chain
-- (one pass over audit_logs' job_id index against the jobs' primary key); else those
-- jobs only.
SELECT m.job_id::text, last.event_type, last.seq
FROM (
    SELECT DISTINCT a.job_id FROM audit_logs a
    WHERE a.job_id IS NOT NULL
      AND (%(ids)s::uuid[] IS NULL OR a.job_id = ANY(%(ids)s::uuid[]))
      AND NOT EXISTS (SELECT FROM jobs j WHERE j.id = a.job_id)
) AS m
CROSS JOIN LATERAL (
    SELECT a.event_type, a.seq FROM audit_logs a
    WHERE a.chain = audit_job_chain(m.job_id) ORDER BY a.seq DESC LIMIT 1
) AS last
WHERE last.event_type <> 'purged'
ORDER BY m.job_id
LIMIT %(limit)s;


-- name: notify_pending
-- Wakes the dispatcher (delivered on commit): a resumed queue's backlog waits to be
-- published (jobs.services.queues.queue_resume).
SELECT pg_notify('jobs_pending', '');


-- name: queues_state
-- Per queue with unfinished jobs: its pending count and oldest pending job's age in
-- seconds, and its queued count (GET /api/v1/queues, jobs.selectors.queues_state).
-- jobs_unfinished_idx (partial: only unfinished jobs); no job contents.
SELECT queue,
    count(*) FILTER (WHERE status = 'pending'),
    EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE status = 'pending'))::float8,
    count(*) FILTER (WHERE status = 'queued')
FROM jobs WHERE status IN ('pending', 'queued')
GROUP BY queue;


-- name: listen_pending
-- The dispatcher's own connection waits for NOTIFY jobs_pending (jobs.queries.
-- PENDING_CHANNEL): a job created or replayed waits to be published.
LISTEN jobs_pending;


-- name: database_exists
-- Whether the database `name` exists on the server (manage.py ensure_database).
SELECT 1 FROM pg_database WHERE datname = %(name)s;


-- name: database_create
-- Creates the database `{name}`, composed as an identifier (psycopg.sql.Identifier):
-- CREATE DATABASE takes no bound parameter.
CREATE DATABASE {name};


-- Connector breakers (docs/connectors.md; jobs.services.connectors). A breaker row is
-- one per connector, made by its first failure (breakers_count) or an operator's open
-- (connector_ensure); no row is closed.
-- Every change of state is a compare-and-set on the row, locked first in a CTE so that
-- the statement returns the state it left (the caller audits a change on the ops chain
-- in the same transaction). Times are the database's clock, shared by every host.


-- name: connector_ensure
-- The connector's breaker row, closed with no failures, unless it exists already.
INSERT INTO connector_breakers (name, state, failures, changed_at, reason)
VALUES (%(name)s, 'closed', 0, now(), '')
ON CONFLICT (name) DO NOTHING;


-- name: breakers_count
-- The ends of a batch of runs counted by their connectors' breakers (breakers_count,
-- jobs/sql/30_breakers.sql): each changed breaker row locked and written once.
SELECT end_n, state_left, state_after, failures_after, probe_at_after, db_now
FROM breakers_count(%(names)s::text[], %(thresholds)s::int[], %(cooldowns)s::float8[],
                    %(connectors)s::text[], %(job_ids)s::uuid[], %(outcomes)s::text[],
                    %(codes)s::text[]);


-- name: connector_admit
-- May job `job_id` call the connector now? Closed (or no row): yes. Open past its
-- probe_at, or half-open with no live probe (none, this job's own again after the
-- reaper gave it back, or one older than `lease` seconds: its worker died): yes, as the
-- one probe, and the breaker goes (or stays) half-open naming it. Otherwise no: open
-- before probe_at, or another job probes. Returns the state before, whether this job
-- probes, probe_at and the database's now; zero rows: no breaker row (closed).
WITH cur AS (
    SELECT b.name, b.state, b.probe_at,
           (b.state = 'open' AND b.probe_at <= now())
           OR (b.state = 'half_open' AND (b.probe_job_id IS NULL
               OR b.probe_job_id = %(job_id)s::uuid
               OR b.probe_started_at < now() - make_interval(secs => %(lease)s::float8)))
               AS probing
    FROM connector_breakers b WHERE b.name = %(name)s
    FOR UPDATE
),
upd AS (
    UPDATE connector_breakers b SET
        state = 'half_open', probe_job_id = %(job_id)s::uuid, probe_started_at = now(),
        changed_at = CASE WHEN cur.state = 'open' THEN now() ELSE b.changed_at END
    FROM cur
    WHERE b.name = cur.name AND cur.probing
)
SELECT cur.state, cur.probing, cur.probe_at, now() FROM cur;


-- name: connector_probe_release
-- The probe job `job_id` ended without telling whether the connector works (cancelled,
-- a non-connector error, its lock lost): the half-open breaker forgets it, and the next
-- job that comes due probes instead. Returns the name when it was the probe.
UPDATE connector_breakers SET probe_job_id = NULL, probe_started_at = NULL
WHERE name = %(name)s AND state = 'half_open' AND probe_job_id = %(job_id)s::uuid
RETURNING name;


-- name: connector_open
-- An operator opens a breaker: open now, a probe after `cooldown` seconds (as when it
-- opens by itself), with who and why. A breaker already open is left as it is (the
-- first opening and its probe time stand). Returns the state it left; zero rows: it
-- was open already.
WITH cur AS (
    SELECT b.name, b.state FROM connector_breakers b WHERE b.name = %(name)s FOR UPDATE
)
UPDATE connector_breakers b SET
    state = 'open', opened_at = now(),
    probe_at = now() + make_interval(secs => %(cooldown)s::float8),
    probe_job_id = NULL, probe_started_at = NULL, changed_at = now(),
    changed_by_id = %(user_id)s::bigint, reason = %(reason)s::text
FROM cur
WHERE b.name = cur.name AND cur.state <> 'open'
RETURNING cur.state AS old_state;


-- name: connector_close
-- An operator closes a breaker (the connector is known to work again): closed, no
-- failures, with who and why. A closed breaker is left as it is. Returns the state it
-- left; zero rows: it was closed already (or has no row).
WITH cur AS (
    SELECT b.name, b.state FROM connector_breakers b WHERE b.name = %(name)s FOR UPDATE
)
UPDATE connector_breakers b SET
    state = 'closed', failures = 0, opened_at = NULL, probe_at = NULL, probe_job_id = NULL,
    probe_started_at = NULL, changed_at = now(), changed_by_id = %(user_id)s::bigint,
    reason = %(reason)s::text
FROM cur
WHERE b.name = cur.name AND cur.state <> 'closed'
RETURNING cur.state AS old_state;


-- name: connector_jobs_release
-- After a breaker closed: the jobs it deferred (retrying with last_error_code
-- CONNECTOR_OPEN, of the connector's `types`) that would wait more than `jitter`
-- seconds come due at a random moment within the next `jitter` seconds, so that they
-- neither wait out a cool-down the connector no longer needs nor all start in the same
-- second. Only the wake-up time moves (not a transition: the status, the version and
-- the audit chain stay; each job's `deferred` entry and the ops chain's
-- `connector_closed` say why it waited). jobs_retry_due_idx serves the range. Returns
-- how many.
WITH released AS (
    UPDATE jobs SET next_run_at = now() + random() * make_interval(secs => %(jitter)s::float8)
    WHERE status = 'retrying' AND type = ANY(%(types)s::text[])
      AND last_error_code = 'CONNECTOR_OPEN'
      AND next_run_at > now() + make_interval(secs => %(jitter)s::float8)
    RETURNING 1
)
SELECT count(*) FROM released;


-- name: connector_states
-- Each breaker's state (a handful of rows), for the connector_state gauge.
SELECT name, state FROM connector_breakers;


-- name: uploads_sweep_claim
-- The sweep (jobs/services/uploads.py uploads_sweep): up to %(limit)s uploads past their
-- horizon (their expires_at, or created_at + %(older_than)s seconds for a purge run with
-- --older-than) by more than the grace, that no job of their organisation names in its
-- params (the jobs_params_gin index answers the @>). Locked with SKIP LOCKED: two
-- dispatchers sweep different rows. An import job's create refuses an expired upload,
-- and the grace outlasts a create's read-then-insert by far, so no job that is being
-- created can name one this takes.
SELECT u.id
FROM uploads u
WHERE CASE WHEN %(older_than)s::float8 IS NULL THEN u.expires_at
           ELSE u.created_at + make_interval(secs => %(older_than)s::float8) END
      < now() - make_interval(secs => %(grace)s::float8)
  AND NOT EXISTS (
      SELECT 1 FROM jobs j
      WHERE j.params @> jsonb_build_object('upload_id', u.id::text) AND j.org_id = u.org_id
  )
ORDER BY u.expires_at
LIMIT %(limit)s
FOR UPDATE OF u SKIP LOCKED;


-- name: uploads_sweep_count
-- What uploads_sweep_claim would take over all its batches, locking nothing (manage.py
-- purge --dry-run).
SELECT count(*)
FROM uploads u
WHERE CASE WHEN %(older_than)s::float8 IS NULL THEN u.expires_at
           ELSE u.created_at + make_interval(secs => %(older_than)s::float8) END
      < now() - make_interval(secs => %(grace)s::float8)
  AND NOT EXISTS (
      SELECT 1 FROM jobs j
      WHERE j.params @> jsonb_build_object('upload_id', u.id::text) AND j.org_id = u.org_id
  );


-- name: audit_stragglers
-- The jobs still in the database that hold an audit partition past its retention
-- (jobs/selectors/stragglers.py): created before `before` (the first day of the first
-- month whose partition may still hold jobs legitimately), each with what keeps it:
-- its status, its idempotency key's expiry, its open dead letters, whether a fix-forward
-- edit waits (jobs_purge_held) and its type's retention in seconds (`types`/`keep`, NULL
-- for a type no longer configured). The total (before the limit), then the oldest
-- `limit`. Such jobs are few (all others were purged): read by created_at.
SELECT count(*) OVER (), j.id::text, j.type, j.status, j.audit_part, j.created_at,
       j.updated_at, j.idempotency_expires_at,
       (SELECT array_agg(d.id ORDER BY d.id) FROM dead_letters d
        WHERE d.job_id = j.id AND d.state = 'open'),
       jobs_purge_held(j), r.secs
FROM jobs j
LEFT JOIN unnest(%(types)s::text[], %(keep)s::float8[]) AS r(type, secs) ON r.type = j.type
WHERE j.created_at < %(before)s
ORDER BY j.created_at
LIMIT %(limit)s;


-- name: force_purge_lock
-- Locks one job for a forced purge (jobs/services/purge_force.py) and says what a
-- forced purge still refuses: its type and status, whether it has an open dead letter,
-- and whether a fix-forward edit of it waits (jobs_purge_held).
SELECT j.type, j.status,
       EXISTS (SELECT FROM dead_letters d WHERE d.job_id = j.id AND d.state = 'open'),
       jobs_purge_held(j)
FROM jobs j WHERE j.id = %(id)s FOR UPDATE;
