-- The transitions of a job (docs/architecture.md#states-and-transitions): one function
-- per kind of change, each derived from the transition table (jobs.states.ALLOWED; the
-- Python callers are jobs.services.transitions). Each takes arrays, so that one call
-- changes one job or a batch, in one statement: the compare-and-set (the jobs that meet
-- its conditions are locked in id order, so batches never deadlock; under READ
-- COMMITTED a row changed meanwhile is locked in its newest version and checked
-- again), the change, each job's audit entry continuing its chain (its payload from
-- the caller's data and the locked row: jobs_entry_payload) and, for a change of
-- status, its job.status.changed event (jobs_changes_record). Returns each changed
-- job's previous status and next_run_at, then its row; a job the compare-and-set
-- refused is simply not returned. A fenced write (`p_locked_by`, `p_attempts`) applies
-- only while that worker still holds that attempt of the job. Leaving `running`
-- releases the lock. The common arguments: `p_data` (each job's entry data beside what
-- the row says: from, to, attempt, context), the actor, `p_ts` (the entry's and event's
-- timestamp, RFC 3339 text as the payload holds it) and `p_request_id` (the entry's
-- context).
-- How each is planned: the given ids, sorted, drive the lock, one primary-key probe per
-- id in a LATERAL subquery with FOR UPDATE (which the planner cannot flatten into a join
-- that scans the status or organisation indexes for every claim: with a backlog and
-- stale statistics, that read the whole backlog per claim). So the generic plan is
-- right whatever the statistics say, and each function keeps it (plan_cache_mode =
-- force_generic_plan, for its nested statements too): a custom plan, which PL/pgSQL
-- otherwise picks for array arguments whose length it cannot see, was planned again at
-- every call, most of a one-job transition's cost in the database.
-- Inside that probe the statuses it accepts are the function's constants (`s_running`,
-- ...), not literals: a generic plan cannot prove a partial index's predicate
-- (`status = 'running'`, `status IN ('pending', ...)`) from a parameter, so the primary
-- key is the only index the probe can take. With literals, on a large table whose
-- statistics say (rightly) that almost no job is running or pending, the planner took
-- jobs_unfinished_idx or jobs_running_lock_idx as a "one-row" full scan per id, reading
-- every running or pending job for each one: beside 1,000,000 finished jobs a claim of
-- 64 read 6,200 buffers instead of 180, and a drain ran at 0.4 of its empty-table rate
-- (docs/benchmarks.md#beside-a-million-finished-jobs).
-- Installed after migrations (core/sqlfiles.py); tests/jobs/test_transition_functions.py
-- holds every function to at most 12 arguments and none that switches behaviour.

-- A worker claims the jobs its broker messages name (the Celery path): `pending`,
-- `queued`, or a due `retrying`, of the message's organisation `p_org_id`, not
-- suspended, in a queue that is not paused. Takes the lock, counts an attempt, starts
-- its progress from zero. NOTIFY jobs_pending when the claim frees a place in a full
-- broker window, which the dispatcher then refills from the backlog at once: only
-- while a claimed job's queue still has `pending` jobs (one probe of
-- jobs_pending_priority_idx, stopping at its first live entry). A queue without a
-- backlog has nothing to refill, and a notification would only wake the dispatcher and
-- every run_worker claimer for an empty pass (one per claim: the most frequent
-- notification of the Celery path). A job created while the claim commits notifies
-- by itself; should its pass still see the window full, the dispatcher's clock
-- (JOBOPS_DISPATCHER_INTERVAL_SECONDS) publishes it.
CREATE OR REPLACE FUNCTION jobs_claim_delivered(
    p_ids uuid[], p_locked_by text, p_org_id bigint, p_data jsonb[], p_actor_type text,
    p_actor_id text, p_ts text, p_request_id text
) RETURNS TABLE (moved_from text, moved_next_run_at timestamptz, moved jobs)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    s_pending CONSTANT text := 'pending';
    s_queued CONSTANT text := 'queued';
    s_retrying CONSTANT text := 'retrying';
BEGIN
    RETURN QUERY
    WITH locked AS (
        SELECT jobs.id, jobs.status, jobs.next_run_at, jobs.audit_head,
               jobs_entry_payload(
                   jobs.id, jobs.audit_seq + 1, jobs.correlation_id, jobs.type, jobs.org_id,
                   jobs.project_id,
                   jsonb_build_object(
                       'from', jobs.status, 'to', 'running', 'attempt', jobs.attempts + 1
                   ) || i.data,
                   'started', p_actor_type, p_actor_id, p_ts, p_request_id
               ) AS payload
        FROM (SELECT * FROM unnest(p_ids, p_data)
              AS u(id, data) ORDER BY u.id) AS i
        CROSS JOIN LATERAL (
            SELECT * FROM jobs
            WHERE jobs.id = i.id
              AND (jobs.status IN (s_pending, s_queued)
                   OR (jobs.status = s_retrying AND jobs.next_run_at <= now()))
              AND jobs.org_id = p_org_id
              AND NOT EXISTS (SELECT FROM organisations o
                             WHERE o.id = jobs.org_id AND o.suspended_at IS NOT NULL)
              AND NOT EXISTS (SELECT FROM queue_pauses q WHERE q.queue = jobs.queue)
            FOR UPDATE
        ) AS jobs
    ),
    upd AS (
        UPDATE jobs SET
            status = 'running',
            version = jobs.version + 1,
            updated_at = now(),
            locked_by = p_locked_by,
            locked_at = now(),
            attempts = jobs.attempts + 1,
            next_run_at = NULL,
            progress_percent = 0,
            progress_step = NULL,
            progress_message = NULL,
            progress_updated_at = NULL,
            progress_metrics = NULL,
            audit_seq = jobs.audit_seq + 1,
            audit_head = audit_chain_hash(locked.audit_head, locked.payload)
        FROM locked
        WHERE jobs.id = locked.id
        RETURNING locked.status::text AS status_from, locked.next_run_at AS next_run_from,
                  locked.payload, locked.audit_head AS prev_hash, jobs AS job,
                  jobs.id AS job_id, jobs.audit_part AS part, jobs.audit_seq AS seq,
                  jobs_status_event(jobs, NULL, locked.status::text, p_ts) AS event
    )
    SELECT upd.status_from, upd.next_run_from, upd.job
    FROM upd
    WHERE (SELECT jobs_changes_record(
               array_agg(job_id), array_agg(part), array_agg(seq), array_agg(event), array_agg(payload),
               array_agg(prev_hash),
               'started', p_actor_type, p_actor_id, p_ts) FROM upd) >= 0;
    IF FOUND AND EXISTS (
        SELECT FROM jobs c
        WHERE c.id = ANY(p_ids)
          AND EXISTS (SELECT FROM jobs p WHERE p.status = 'pending' AND p.queue = c.queue)
    ) THEN
        PERFORM pg_notify('jobs_pending', '');
    END IF;
END;
$$;


-- A run_worker host claims the jobs it selected (claimable_jobs, jobs/queries.sql):
-- `pending` or a due `retrying`, of an organisation not suspended, in a queue not
-- paused; as jobs_claim_delivered, without a broker window to refill.
CREATE OR REPLACE FUNCTION jobs_claim_polled(
    p_ids uuid[], p_locked_by text, p_data jsonb[], p_actor_type text, p_actor_id text,
    p_ts text, p_request_id text
) RETURNS TABLE (moved_from text, moved_next_run_at timestamptz, moved jobs)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    s_pending CONSTANT text := 'pending';
    s_retrying CONSTANT text := 'retrying';
BEGIN
    RETURN QUERY
    WITH locked AS (
        SELECT jobs.id, jobs.status, jobs.next_run_at, jobs.audit_head,
               jobs_entry_payload(
                   jobs.id, jobs.audit_seq + 1, jobs.correlation_id, jobs.type, jobs.org_id,
                   jobs.project_id,
                   jsonb_build_object(
                       'from', jobs.status, 'to', 'running', 'attempt', jobs.attempts + 1
                   ) || i.data,
                   'started', p_actor_type, p_actor_id, p_ts, p_request_id
               ) AS payload
        FROM (SELECT * FROM unnest(p_ids, p_data)
              AS u(id, data) ORDER BY u.id) AS i
        CROSS JOIN LATERAL (
            SELECT * FROM jobs
            WHERE jobs.id = i.id
              AND (jobs.status = s_pending
                   OR (jobs.status = s_retrying AND jobs.next_run_at <= now()))
              AND NOT EXISTS (SELECT FROM organisations o
                             WHERE o.id = jobs.org_id AND o.suspended_at IS NOT NULL)
              AND NOT EXISTS (SELECT FROM queue_pauses q WHERE q.queue = jobs.queue)
            FOR UPDATE
        ) AS jobs
    ),
    upd AS (
        UPDATE jobs SET
            status = 'running',
            version = jobs.version + 1,
            updated_at = now(),
            locked_by = p_locked_by,
            locked_at = now(),
            attempts = jobs.attempts + 1,
            next_run_at = NULL,
            progress_percent = 0,
            progress_step = NULL,
            progress_message = NULL,
            progress_updated_at = NULL,
            progress_metrics = NULL,
            audit_seq = jobs.audit_seq + 1,
            audit_head = audit_chain_hash(locked.audit_head, locked.payload)
        FROM locked
        WHERE jobs.id = locked.id
        RETURNING locked.status::text AS status_from, locked.next_run_at AS next_run_from,
                  locked.payload, locked.audit_head AS prev_hash, jobs AS job,
                  jobs.id AS job_id, jobs.audit_part AS part, jobs.audit_seq AS seq,
                  jobs_status_event(jobs, NULL, locked.status::text, p_ts) AS event
    )
    SELECT upd.status_from, upd.next_run_from, upd.job
    FROM upd
    WHERE (SELECT jobs_changes_record(
               array_agg(job_id), array_agg(part), array_agg(seq), array_agg(event), array_agg(payload),
               array_agg(prev_hash),
               'started', p_actor_type, p_actor_id, p_ts) FROM upd) >= 0;
END;
$$;


-- The lock holder writes a progress value: monotonic within the attempt (never back,
-- even when two writes cross), moving the version. Its `progress` entry records the
-- percent the row holds after the write; its job.progress event (jobs_progress_event)
-- goes to the outbox in the same transaction, as a change of status's does. The worker
-- coalesces writes (JOBOPS_PROGRESS_INTERVAL_SECONDS): one event per write.
-- `p_metrics` (name -> number, NULL: none) replace the row's as its step and message do;
-- they go in the event, never in the hashed `progress` entry (it carries no floats).
CREATE OR REPLACE FUNCTION jobs_progress_with_metrics(
    p_ids uuid[], p_attempts int[], p_locked_by text, p_percents int[], p_steps text[],
    p_messages text[], p_metrics jsonb[], p_data jsonb[], p_actor_type text,
    p_actor_id text, p_ts text, p_request_id text
) RETURNS TABLE (moved_from text, moved_next_run_at timestamptz, moved jobs)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    s_running CONSTANT text := 'running';
BEGIN
    RETURN QUERY
    WITH locked AS (
        SELECT jobs.id, jobs.status, jobs.next_run_at, jobs.audit_head,
               i.percent, i.step, i.message, i.metrics,
               jobs_entry_payload(
                   jobs.id, jobs.audit_seq + 1, jobs.correlation_id, jobs.type, jobs.org_id,
                   jobs.project_id,
                   jsonb_build_object(
                       'percent', GREATEST(jobs.progress_percent, i.percent), 'step', i.step,
                       'attempt', jobs.attempts
                   ) || i.data,
                   'progress', p_actor_type, p_actor_id, p_ts, p_request_id
               ) AS payload
        FROM (SELECT * FROM unnest(p_ids, p_attempts, p_percents, p_steps, p_messages,
                                   p_metrics, p_data)
              AS u(id, attempt, percent, step, message, metrics, data) ORDER BY u.id) AS i
        CROSS JOIN LATERAL (
            SELECT * FROM jobs
            WHERE jobs.id = i.id
              AND jobs.status = s_running AND jobs.locked_by = p_locked_by
              AND jobs.attempts = i.attempt
            FOR UPDATE
        ) AS jobs
    ),
    upd AS (
        UPDATE jobs SET
            version = jobs.version + 1,
            updated_at = now(),
            progress_percent = GREATEST(jobs.progress_percent, locked.percent),
            progress_step = locked.step,
            progress_message = locked.message,
            progress_metrics = locked.metrics,
            progress_updated_at = now(),
            audit_seq = jobs.audit_seq + 1,
            audit_head = audit_chain_hash(locked.audit_head, locked.payload)
        FROM locked
        WHERE jobs.id = locked.id
        RETURNING locked.status::text AS status_from, locked.next_run_at AS next_run_from,
                  locked.payload, locked.audit_head AS prev_hash, jobs AS job,
                  jobs.id AS job_id, jobs.audit_part AS part, jobs.audit_seq AS seq,
                  jobs_progress_event(jobs, p_ts, locked.metrics) AS event
    )
    SELECT upd.status_from, upd.next_run_from, upd.job
    FROM upd
    WHERE (SELECT jobs_changes_record(
               array_agg(job_id), array_agg(part), array_agg(seq), array_agg(event), array_agg(payload),
               array_agg(prev_hash),
               'progress', p_actor_type, p_actor_id, p_ts) FROM upd) >= 0;
END;
$$;


-- `running` -> `succeeded` by the lock holder, with its result; progress 100 % (with the
-- last progress value's step, message and metrics, `p_progress`, when there is one).
CREATE OR REPLACE FUNCTION jobs_succeed(
    p_ids uuid[], p_attempts int[], p_locked_by text, p_results jsonb[],
    p_progress jsonb[], p_data jsonb[], p_actor_type text, p_actor_id text, p_ts text,
    p_request_id text
) RETURNS TABLE (moved_from text, moved_next_run_at timestamptz, moved jobs)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    s_running CONSTANT text := 'running';
BEGIN
    RETURN QUERY
    WITH locked AS (
        SELECT jobs.id, jobs.status, jobs.next_run_at, jobs.audit_head,
               i.result, i.progress,
               jobs_entry_payload(
                   jobs.id, jobs.audit_seq + 1, jobs.correlation_id, jobs.type, jobs.org_id,
                   jobs.project_id,
                   jsonb_build_object(
                       'from', jobs.status, 'to', 'succeeded', 'attempt', jobs.attempts
                   ) || i.data,
                   'succeeded', p_actor_type, p_actor_id, p_ts, p_request_id
               ) AS payload
        FROM (SELECT * FROM unnest(p_ids, p_attempts, p_results, p_progress, p_data)
              AS u(id, attempt, result, progress, data) ORDER BY u.id) AS i
        CROSS JOIN LATERAL (
            SELECT * FROM jobs
            WHERE jobs.id = i.id
              AND jobs.status = s_running AND jobs.locked_by = p_locked_by
              AND jobs.attempts = i.attempt
            FOR UPDATE
        ) AS jobs
    ),
    upd AS (
        UPDATE jobs SET
            status = 'succeeded',
            version = jobs.version + 1,
            updated_at = now(),
            locked_by = NULL,
            locked_at = NULL,
            result = locked.result,
            last_error_code = NULL,
            last_error_message = NULL,
            progress_percent = 100,
            progress_step = CASE WHEN locked.progress IS NULL THEN jobs.progress_step
                ELSE locked.progress->>'step' END,
            progress_message = CASE WHEN locked.progress IS NULL THEN jobs.progress_message
                ELSE locked.progress->>'message' END,
            progress_metrics = CASE WHEN locked.progress IS NULL THEN jobs.progress_metrics
                ELSE locked.progress->'metrics' END,
            progress_updated_at = now(),
            audit_seq = jobs.audit_seq + 1,
            audit_head = audit_chain_hash(locked.audit_head, locked.payload)
        FROM locked
        WHERE jobs.id = locked.id
        RETURNING locked.status::text AS status_from, locked.next_run_at AS next_run_from,
                  locked.payload, locked.audit_head AS prev_hash, jobs AS job,
                  jobs.id AS job_id, jobs.audit_part AS part, jobs.audit_seq AS seq,
                  jobs_status_event(jobs, NULL, locked.status::text, p_ts) AS event
    )
    SELECT upd.status_from, upd.next_run_from, upd.job
    FROM upd
    WHERE (SELECT jobs_changes_record(
               array_agg(job_id), array_agg(part), array_agg(seq), array_agg(event), array_agg(payload),
               array_agg(prev_hash),
               'succeeded', p_actor_type, p_actor_id, p_ts) FROM upd) >= 0;
END;
$$;


-- `running` -> `retrying` by the lock holder: the next attempt `p_run_in` seconds from
-- now (the dispatcher republishes it then), with the error; the last progress value
-- (`p_progress`: percent, step, message, or none) is flushed.
CREATE OR REPLACE FUNCTION jobs_retry(
    p_ids uuid[], p_attempts int[], p_locked_by text, p_run_in float8[], p_codes text[],
    p_messages text[], p_progress jsonb[], p_data jsonb[], p_actor_type text,
    p_actor_id text, p_ts text, p_request_id text
) RETURNS TABLE (moved_from text, moved_next_run_at timestamptz, moved jobs)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    s_running CONSTANT text := 'running';
BEGIN
    RETURN QUERY
    WITH locked AS (
        SELECT jobs.id, jobs.status, jobs.next_run_at, jobs.audit_head,
               i.run_in, i.code, i.message, i.progress,
               jobs_entry_payload(
                   jobs.id, jobs.audit_seq + 1, jobs.correlation_id, jobs.type, jobs.org_id,
                   jobs.project_id,
                   jsonb_build_object(
                       'from', jobs.status, 'to', 'retrying', 'attempt', jobs.attempts
                   ) || i.data,
                   'retrying', p_actor_type, p_actor_id, p_ts, p_request_id
               ) AS payload
        FROM (SELECT * FROM unnest(p_ids, p_attempts, p_run_in, p_codes, p_messages, p_progress, p_data)
              AS u(id, attempt, run_in, code, message, progress, data) ORDER BY u.id) AS i
        CROSS JOIN LATERAL (
            SELECT * FROM jobs
            WHERE jobs.id = i.id
              AND jobs.status = s_running AND jobs.locked_by = p_locked_by
              AND jobs.attempts = i.attempt
            FOR UPDATE
        ) AS jobs
    ),
    upd AS (
        UPDATE jobs SET
            status = 'retrying',
            version = jobs.version + 1,
            updated_at = now(),
            locked_by = NULL,
            locked_at = NULL,
            next_run_at = now() + make_interval(secs => locked.run_in),
            last_error_code = locked.code,
            last_error_message = locked.message,
            progress_percent = CASE WHEN locked.progress IS NULL THEN jobs.progress_percent
                ELSE GREATEST(jobs.progress_percent, (locked.progress->>'percent')::int) END,
            progress_step = CASE WHEN locked.progress IS NULL THEN jobs.progress_step
                ELSE locked.progress->>'step' END,
            progress_message = CASE WHEN locked.progress IS NULL THEN jobs.progress_message
                ELSE locked.progress->>'message' END,
            progress_metrics = CASE WHEN locked.progress IS NULL THEN jobs.progress_metrics
                ELSE locked.progress->'metrics' END,
            progress_updated_at = CASE WHEN locked.progress IS NULL THEN jobs.progress_updated_at
                ELSE now() END,
            audit_seq = jobs.audit_seq + 1,
            audit_head = audit_chain_hash(locked.audit_head, locked.payload)
        FROM locked
        WHERE jobs.id = locked.id
        RETURNING locked.status::text AS status_from, locked.next_run_at AS next_run_from,
                  locked.payload, locked.audit_head AS prev_hash, jobs AS job,
                  jobs.id AS job_id, jobs.audit_part AS part, jobs.audit_seq AS seq,
                  jobs_status_event(jobs, NULL, locked.status::text, p_ts) AS event
    )
    SELECT upd.status_from, upd.next_run_from, upd.job
    FROM upd
    WHERE (SELECT jobs_changes_record(
               array_agg(job_id), array_agg(part), array_agg(seq), array_agg(event), array_agg(payload),
               array_agg(prev_hash),
               'retrying', p_actor_type, p_actor_id, p_ts) FROM upd) >= 0;
END;
$$;


-- jobs_retry for a job whose connector's breaker is not closed (docs/connectors.md): it
-- waits for the probe, its budget grown by the attempts its entry says it is granted
-- (`attempts_extended` of `p_data`: one on its last attempt, so that it does not
-- dead-letter).
CREATE OR REPLACE FUNCTION jobs_retry_held(
    p_ids uuid[], p_attempts int[], p_locked_by text, p_run_in float8[], p_codes text[],
    p_messages text[], p_progress jsonb[], p_data jsonb[], p_actor_type text,
    p_actor_id text, p_ts text, p_request_id text
) RETURNS TABLE (moved_from text, moved_next_run_at timestamptz, moved jobs)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    s_running CONSTANT text := 'running';
BEGIN
    RETURN QUERY
    WITH locked AS (
        SELECT jobs.id, jobs.status, jobs.next_run_at, jobs.audit_head,
               i.run_in, i.code, i.message, i.progress, i.data,
               jobs_entry_payload(
                   jobs.id, jobs.audit_seq + 1, jobs.correlation_id, jobs.type, jobs.org_id,
                   jobs.project_id,
                   jsonb_build_object(
                       'from', jobs.status, 'to', 'retrying', 'attempt', jobs.attempts
                   ) || i.data,
                   'retrying', p_actor_type, p_actor_id, p_ts, p_request_id
               ) AS payload
        FROM (SELECT * FROM unnest(p_ids, p_attempts, p_run_in, p_codes, p_messages, p_progress, p_data)
              AS u(id, attempt, run_in, code, message, progress, data) ORDER BY u.id) AS i
        CROSS JOIN LATERAL (
            SELECT * FROM jobs
            WHERE jobs.id = i.id
              AND jobs.status = s_running AND jobs.locked_by = p_locked_by
              AND jobs.attempts = i.attempt
            FOR UPDATE
        ) AS jobs
    ),
    upd AS (
        UPDATE jobs SET
            status = 'retrying',
            version = jobs.version + 1,
            updated_at = now(),
            locked_by = NULL,
            locked_at = NULL,
            next_run_at = now() + make_interval(secs => locked.run_in),
            last_error_code = locked.code,
            last_error_message = locked.message,
            progress_percent = CASE WHEN locked.progress IS NULL THEN jobs.progress_percent
                ELSE GREATEST(jobs.progress_percent, (locked.progress->>'percent')::int) END,
            progress_step = CASE WHEN locked.progress IS NULL THEN jobs.progress_step
                ELSE locked.progress->>'step' END,
            progress_message = CASE WHEN locked.progress IS NULL THEN jobs.progress_message
                ELSE locked.progress->>'message' END,
            progress_metrics = CASE WHEN locked.progress IS NULL THEN jobs.progress_metrics
                ELSE locked.progress->'metrics' END,
            progress_updated_at = CASE WHEN locked.progress IS NULL THEN jobs.progress_updated_at
                ELSE now() END,
            max_attempts = jobs.max_attempts + (locked.data->>'attempts_extended')::int,
            audit_seq = jobs.audit_seq + 1,
            audit_head = audit_chain_hash(locked.audit_head, locked.payload)
        FROM locked
        WHERE jobs.id = locked.id
        RETURNING locked.status::text AS status_from, locked.next_run_at AS next_run_from,
                  locked.payload, locked.audit_head AS prev_hash, jobs AS job,
                  jobs.id AS job_id, jobs.audit_part AS part, jobs.audit_seq AS seq,
                  jobs_status_event(jobs, NULL, locked.status::text, p_ts) AS event
    )
    SELECT upd.status_from, upd.next_run_from, upd.job
    FROM upd
    WHERE (SELECT jobs_changes_record(
               array_agg(job_id), array_agg(part), array_agg(seq), array_agg(event), array_agg(payload),
               array_agg(prev_hash),
               'retrying', p_actor_type, p_actor_id, p_ts) FROM upd) >= 0;
END;
$$;


-- `running` -> `cancelled` by the lock holder after its handler saw the flag; the last
-- progress value is flushed.
CREATE OR REPLACE FUNCTION jobs_cancel_confirm(
    p_ids uuid[], p_attempts int[], p_locked_by text, p_progress jsonb[], p_data jsonb[],
    p_actor_type text, p_actor_id text, p_ts text, p_request_id text
) RETURNS TABLE (moved_from text, moved_next_run_at timestamptz, moved jobs)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    s_running CONSTANT text := 'running';
BEGIN
    RETURN QUERY
    WITH locked AS (
        SELECT jobs.id, jobs.status, jobs.next_run_at, jobs.audit_head,
               i.progress,
               jobs_entry_payload(
                   jobs.id, jobs.audit_seq + 1, jobs.correlation_id, jobs.type, jobs.org_id,
                   jobs.project_id,
                   jsonb_build_object(
                       'from', jobs.status, 'to', 'cancelled', 'attempt', jobs.attempts
                   ) || i.data,
                   'cancelled', p_actor_type, p_actor_id, p_ts, p_request_id
               ) AS payload
        FROM (SELECT * FROM unnest(p_ids, p_attempts, p_progress, p_data)
              AS u(id, attempt, progress, data) ORDER BY u.id) AS i
        CROSS JOIN LATERAL (
            SELECT * FROM jobs
            WHERE jobs.id = i.id
              AND jobs.status = s_running AND jobs.locked_by = p_locked_by
              AND jobs.attempts = i.attempt
            FOR UPDATE
        ) AS jobs
    ),
    upd AS (
        UPDATE jobs SET
            status = 'cancelled',
            version = jobs.version + 1,
            updated_at = now(),
            locked_by = NULL,
            locked_at = NULL,
            progress_percent = CASE WHEN locked.progress IS NULL THEN jobs.progress_percent
                ELSE GREATEST(jobs.progress_percent, (locked.progress->>'percent')::int) END,
            progress_step = CASE WHEN locked.progress IS NULL THEN jobs.progress_step
                ELSE locked.progress->>'step' END,
            progress_message = CASE WHEN locked.progress IS NULL THEN jobs.progress_message
                ELSE locked.progress->>'message' END,
            progress_metrics = CASE WHEN locked.progress IS NULL THEN jobs.progress_metrics
                ELSE locked.progress->'metrics' END,
            progress_updated_at = CASE WHEN locked.progress IS NULL THEN jobs.progress_updated_at
                ELSE now() END,
            audit_seq = jobs.audit_seq + 1,
            audit_head = audit_chain_hash(locked.audit_head, locked.payload)
        FROM locked
        WHERE jobs.id = locked.id
        RETURNING locked.status::text AS status_from, locked.next_run_at AS next_run_from,
                  locked.payload, locked.audit_head AS prev_hash, jobs AS job,
                  jobs.id AS job_id, jobs.audit_part AS part, jobs.audit_seq AS seq,
                  jobs_status_event(jobs, NULL, locked.status::text, p_ts) AS event
    )
    SELECT upd.status_from, upd.next_run_from, upd.job
    FROM upd
    WHERE (SELECT jobs_changes_record(
               array_agg(job_id), array_agg(part), array_agg(seq), array_agg(event), array_agg(payload),
               array_agg(prev_hash),
               'cancelled', p_actor_type, p_actor_id, p_ts) FROM upd) >= 0;
END;
$$;


-- `running` -> `retrying` before the handler ran (its connector's breaker is open,
-- docs/connectors.md), audited `deferred`: the attempt the claim counted is given back,
-- the next one `p_run_in` seconds from now.
CREATE OR REPLACE FUNCTION jobs_defer(
    p_ids uuid[], p_attempts int[], p_locked_by text, p_run_in float8[], p_codes text[],
    p_messages text[], p_data jsonb[], p_actor_type text, p_actor_id text, p_ts text,
    p_request_id text
) RETURNS TABLE (moved_from text, moved_next_run_at timestamptz, moved jobs)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    s_running CONSTANT text := 'running';
BEGIN
    RETURN QUERY
    WITH locked AS (
        SELECT jobs.id, jobs.status, jobs.next_run_at, jobs.audit_head,
               i.run_in, i.code, i.message,
               jobs_entry_payload(
                   jobs.id, jobs.audit_seq + 1, jobs.correlation_id, jobs.type, jobs.org_id,
                   jobs.project_id,
                   jsonb_build_object(
                       'from', jobs.status, 'to', 'retrying', 'attempt', jobs.attempts
                   ) || i.data,
                   'deferred', p_actor_type, p_actor_id, p_ts, p_request_id
               ) AS payload
        FROM (SELECT * FROM unnest(p_ids, p_attempts, p_run_in, p_codes, p_messages, p_data)
              AS u(id, attempt, run_in, code, message, data) ORDER BY u.id) AS i
        CROSS JOIN LATERAL (
            SELECT * FROM jobs
            WHERE jobs.id = i.id
              AND jobs.status = s_running AND jobs.locked_by = p_locked_by
              AND jobs.attempts = i.attempt
            FOR UPDATE
        ) AS jobs
    ),
    upd AS (
        UPDATE jobs SET
            status = 'retrying',
            version = jobs.version + 1,
            updated_at = now(),
            locked_by = NULL,
            locked_at = NULL,
            attempts = jobs.attempts - 1,
            next_run_at = now() + make_interval(secs => locked.run_in),
            last_error_code = locked.code,
            last_error_message = locked.message,
            audit_seq = jobs.audit_seq + 1,
            audit_head = audit_chain_hash(locked.audit_head, locked.payload)
        FROM locked
        WHERE jobs.id = locked.id
        RETURNING locked.status::text AS status_from, locked.next_run_at AS next_run_from,
                  locked.payload, locked.audit_head AS prev_hash, jobs AS job,
                  jobs.id AS job_id, jobs.audit_part AS part, jobs.audit_seq AS seq,
                  jobs_status_event(jobs, NULL, locked.status::text, p_ts) AS event
    )
    SELECT upd.status_from, upd.next_run_from, upd.job
    FROM upd
    WHERE (SELECT jobs_changes_record(
               array_agg(job_id), array_agg(part), array_agg(seq), array_agg(event), array_agg(payload),
               array_agg(prev_hash),
               'deferred', p_actor_type, p_actor_id, p_ts) FROM upd) >= 0;
END;
$$;


-- `running` -> `failed` by the lock holder, into the dead-letter queue `p_queues` with
-- the error (the caller opens the dead letter in the same transaction).
CREATE OR REPLACE FUNCTION jobs_fail_fenced(
    p_ids uuid[], p_attempts int[], p_locked_by text, p_queues text[], p_codes text[],
    p_messages text[], p_data jsonb[], p_actor_type text, p_actor_id text, p_ts text,
    p_request_id text
) RETURNS TABLE (moved_from text, moved_next_run_at timestamptz, moved jobs)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    s_running CONSTANT text := 'running';
BEGIN
    RETURN QUERY
    WITH locked AS (
        SELECT jobs.id, jobs.status, jobs.next_run_at, jobs.audit_head,
               i.queue, i.code, i.message,
               jobs_entry_payload(
                   jobs.id, jobs.audit_seq + 1, jobs.correlation_id, jobs.type, jobs.org_id,
                   jobs.project_id,
                   jsonb_build_object(
                       'from', jobs.status, 'to', 'failed', 'attempt', jobs.attempts
                   ) || i.data,
                   'failed', p_actor_type, p_actor_id, p_ts, p_request_id
               ) AS payload
        FROM (SELECT * FROM unnest(p_ids, p_attempts, p_queues, p_codes, p_messages, p_data)
              AS u(id, attempt, queue, code, message, data) ORDER BY u.id) AS i
        CROSS JOIN LATERAL (
            SELECT * FROM jobs
            WHERE jobs.id = i.id
              AND jobs.status = s_running AND jobs.locked_by = p_locked_by
              AND jobs.attempts = i.attempt
            FOR UPDATE
        ) AS jobs
    ),
    upd AS (
        UPDATE jobs SET
            status = 'failed',
            version = jobs.version + 1,
            updated_at = now(),
            locked_by = NULL,
            locked_at = NULL,
            dead_letter_queue = locked.queue,
            last_error_code = locked.code,
            last_error_message = locked.message,
            audit_seq = jobs.audit_seq + 1,
            audit_head = audit_chain_hash(locked.audit_head, locked.payload)
        FROM locked
        WHERE jobs.id = locked.id
        RETURNING locked.status::text AS status_from, locked.next_run_at AS next_run_from,
                  locked.payload, locked.audit_head AS prev_hash, jobs AS job,
                  jobs.id AS job_id, jobs.audit_part AS part, jobs.audit_seq AS seq,
                  jobs_status_event(jobs, NULL, locked.status::text, p_ts) AS event
    )
    SELECT upd.status_from, upd.next_run_from, upd.job
    FROM upd
    WHERE (SELECT jobs_changes_record(
               array_agg(job_id), array_agg(part), array_agg(seq), array_agg(event), array_agg(payload),
               array_agg(prev_hash),
               'failed', p_actor_type, p_actor_id, p_ts) FROM upd) >= 0;
END;
$$;


-- `p_sources` -> `failed` while the job's lock is older than `p_stale_after` seconds by
-- the database clock (the reaper's last attempt, the dead-letter watcher), into its
-- dead-letter queue with the error.
CREATE OR REPLACE FUNCTION jobs_fail_stale(
    p_ids uuid[], p_sources text[], p_stale_after float8, p_queues text[], p_codes text[],
    p_messages text[], p_data jsonb[], p_actor_type text, p_actor_id text, p_ts text,
    p_request_id text
) RETURNS TABLE (moved_from text, moved_next_run_at timestamptz, moved jobs)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN QUERY
    WITH locked AS (
        SELECT jobs.id, jobs.status, jobs.next_run_at, jobs.audit_head,
               i.queue, i.code, i.message,
               jobs_entry_payload(
                   jobs.id, jobs.audit_seq + 1, jobs.correlation_id, jobs.type, jobs.org_id,
                   jobs.project_id,
                   jsonb_build_object(
                       'from', jobs.status, 'to', 'failed', 'attempt', jobs.attempts
                   ) || i.data,
                   'failed', p_actor_type, p_actor_id, p_ts, p_request_id
               ) AS payload
        FROM (SELECT * FROM unnest(p_ids, p_queues, p_codes, p_messages, p_data)
              AS u(id, queue, code, message, data) ORDER BY u.id) AS i
        CROSS JOIN LATERAL (
            SELECT * FROM jobs
            WHERE jobs.id = i.id
              AND jobs.status = ANY(p_sources)
              AND jobs.locked_at < now() - make_interval(secs => p_stale_after)
            FOR UPDATE
        ) AS jobs
    ),
    upd AS (
        UPDATE jobs SET
            status = 'failed',
            version = jobs.version + 1,
            updated_at = now(),
            locked_by = NULL,
            locked_at = NULL,
            dead_letter_queue = locked.queue,
            last_error_code = locked.code,
            last_error_message = locked.message,
            audit_seq = jobs.audit_seq + 1,
            audit_head = audit_chain_hash(locked.audit_head, locked.payload)
        FROM locked
        WHERE jobs.id = locked.id
        RETURNING locked.status::text AS status_from, locked.next_run_at AS next_run_from,
                  locked.payload, locked.audit_head AS prev_hash, jobs AS job,
                  jobs.id AS job_id, jobs.audit_part AS part, jobs.audit_seq AS seq,
                  jobs_status_event(jobs, NULL, locked.status::text, p_ts) AS event
    )
    SELECT upd.status_from, upd.next_run_from, upd.job
    FROM upd
    WHERE (SELECT jobs_changes_record(
               array_agg(job_id), array_agg(part), array_agg(seq), array_agg(event), array_agg(payload),
               array_agg(prev_hash),
               'failed', p_actor_type, p_actor_id, p_ts) FROM upd) >= 0;
END;
$$;


-- `p_sources` -> `failed` (the dead-letter watcher: a job whose message the broker
-- dead-lettered), into its dead-letter queue with the error.
CREATE OR REPLACE FUNCTION jobs_fail(
    p_ids uuid[], p_sources text[], p_queues text[], p_codes text[], p_messages text[],
    p_data jsonb[], p_actor_type text, p_actor_id text, p_ts text, p_request_id text
) RETURNS TABLE (moved_from text, moved_next_run_at timestamptz, moved jobs)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN QUERY
    WITH locked AS (
        SELECT jobs.id, jobs.status, jobs.next_run_at, jobs.audit_head,
               i.queue, i.code, i.message,
               jobs_entry_payload(
                   jobs.id, jobs.audit_seq + 1, jobs.correlation_id, jobs.type, jobs.org_id,
                   jobs.project_id,
                   jsonb_build_object(
                       'from', jobs.status, 'to', 'failed', 'attempt', jobs.attempts
                   ) || i.data,
                   'failed', p_actor_type, p_actor_id, p_ts, p_request_id
               ) AS payload
        FROM (SELECT * FROM unnest(p_ids, p_queues, p_codes, p_messages, p_data)
              AS u(id, queue, code, message, data) ORDER BY u.id) AS i
        CROSS JOIN LATERAL (
            SELECT * FROM jobs
            WHERE jobs.id = i.id
              AND jobs.status = ANY(p_sources)
            FOR UPDATE
        ) AS jobs
    ),
    upd AS (
        UPDATE jobs SET
            status = 'failed',
            version = jobs.version + 1,
            updated_at = now(),
            locked_by = NULL,
            locked_at = NULL,
            dead_letter_queue = locked.queue,
            last_error_code = locked.code,
            last_error_message = locked.message,
            audit_seq = jobs.audit_seq + 1,
            audit_head = audit_chain_hash(locked.audit_head, locked.payload)
        FROM locked
        WHERE jobs.id = locked.id
        RETURNING locked.status::text AS status_from, locked.next_run_at AS next_run_from,
                  locked.payload, locked.audit_head AS prev_hash, jobs AS job,
                  jobs.id AS job_id, jobs.audit_part AS part, jobs.audit_seq AS seq,
                  jobs_status_event(jobs, NULL, locked.status::text, p_ts) AS event
    )
    SELECT upd.status_from, upd.next_run_from, upd.job
    FROM upd
    WHERE (SELECT jobs_changes_record(
               array_agg(job_id), array_agg(part), array_agg(seq), array_agg(event), array_agg(payload),
               array_agg(prev_hash),
               'failed', p_actor_type, p_actor_id, p_ts) FROM upd) >= 0;
END;
$$;


-- Raise the cancel flag of a job that has not ended and was not flagged yet, moving
-- the version; its `cancel_requested` entry. No status change, no event.
CREATE OR REPLACE FUNCTION jobs_cancel_request(
    p_ids uuid[], p_data jsonb[], p_actor_type text, p_actor_id text, p_ts text,
    p_request_id text
) RETURNS TABLE (moved_from text, moved_next_run_at timestamptz, moved jobs)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN QUERY
    WITH locked AS (
        SELECT jobs.id, jobs.status, jobs.next_run_at, jobs.audit_head,
               jobs_entry_payload(
                   jobs.id, jobs.audit_seq + 1, jobs.correlation_id, jobs.type, jobs.org_id,
                   jobs.project_id,
                   jsonb_build_object('attempt', jobs.attempts) || i.data,
                   'cancel_requested', p_actor_type, p_actor_id, p_ts, p_request_id
               ) AS payload
        FROM (SELECT * FROM unnest(p_ids, p_data)
              AS u(id, data) ORDER BY u.id) AS i
        CROSS JOIN LATERAL (
            SELECT * FROM jobs
            WHERE jobs.id = i.id
              AND NOT jobs.cancel_requested
              AND jobs.status NOT IN ('succeeded', 'failed', 'cancelled')
            FOR UPDATE
        ) AS jobs
    ),
    upd AS (
        UPDATE jobs SET
            version = jobs.version + 1,
            updated_at = now(),
            cancel_requested = true,
            audit_seq = jobs.audit_seq + 1,
            audit_head = audit_chain_hash(locked.audit_head, locked.payload)
        FROM locked
        WHERE jobs.id = locked.id
        RETURNING locked.status::text AS status_from, locked.next_run_at AS next_run_from,
                  locked.payload, locked.audit_head AS prev_hash, jobs AS job,
                  jobs.id AS job_id, jobs.audit_part AS part, jobs.audit_seq AS seq
    )
    SELECT upd.status_from, upd.next_run_from, upd.job
    FROM upd
    WHERE (SELECT audit_append_job_entries(
               array_agg(job_id), array_agg(part), array_agg(seq), array_agg(payload), array_agg(prev_hash),
               'cancel_requested', p_actor_type, p_actor_id, p_ts::timestamptz) FROM upd) >= 0;
END;
$$;


-- A job that has not started (`scheduled`, `pending`, `queued`, `retrying`) ->
-- `cancelled` (a running one stops at its handler's next check).
CREATE OR REPLACE FUNCTION jobs_cancel(
    p_ids uuid[], p_data jsonb[], p_actor_type text, p_actor_id text, p_ts text,
    p_request_id text
) RETURNS TABLE (moved_from text, moved_next_run_at timestamptz, moved jobs)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    s_scheduled CONSTANT text := 'scheduled';
    s_pending CONSTANT text := 'pending';
    s_queued CONSTANT text := 'queued';
    s_retrying CONSTANT text := 'retrying';
BEGIN
    RETURN QUERY
    WITH locked AS (
        SELECT jobs.id, jobs.status, jobs.next_run_at, jobs.audit_head,
               jobs_entry_payload(
                   jobs.id, jobs.audit_seq + 1, jobs.correlation_id, jobs.type, jobs.org_id,
                   jobs.project_id,
                   jsonb_build_object(
                       'from', jobs.status, 'to', 'cancelled', 'attempt', jobs.attempts
                   ) || i.data,
                   'cancelled', p_actor_type, p_actor_id, p_ts, p_request_id
               ) AS payload
        FROM (SELECT * FROM unnest(p_ids, p_data)
              AS u(id, data) ORDER BY u.id) AS i
        CROSS JOIN LATERAL (
            SELECT * FROM jobs
            WHERE jobs.id = i.id
              AND jobs.status IN (s_scheduled, s_pending, s_queued, s_retrying)
            FOR UPDATE
        ) AS jobs
    ),
    upd AS (
        UPDATE jobs SET
            status = 'cancelled',
            version = jobs.version + 1,
            updated_at = now(),
            locked_by = NULL,
            locked_at = NULL,
            audit_seq = jobs.audit_seq + 1,
            audit_head = audit_chain_hash(locked.audit_head, locked.payload)
        FROM locked
        WHERE jobs.id = locked.id
        RETURNING locked.status::text AS status_from, locked.next_run_at AS next_run_from,
                  locked.payload, locked.audit_head AS prev_hash, jobs AS job,
                  jobs.id AS job_id, jobs.audit_part AS part, jobs.audit_seq AS seq,
                  jobs_status_event(jobs, NULL, locked.status::text, p_ts) AS event
    )
    SELECT upd.status_from, upd.next_run_from, upd.job
    FROM upd
    WHERE (SELECT jobs_changes_record(
               array_agg(job_id), array_agg(part), array_agg(seq), array_agg(event), array_agg(payload),
               array_agg(prev_hash),
               'cancelled', p_actor_type, p_actor_id, p_ts) FROM upd) >= 0;
END;
$$;


-- The reaper: `running` with a lock older than `p_stale_after` seconds (the database
-- clock) -> `retrying`, due now, with the error `p_code`/`p_message`; audited
-- `reclaimed`.
CREATE OR REPLACE FUNCTION jobs_reclaim(
    p_ids uuid[], p_stale_after float8, p_code text, p_message text, p_data jsonb[],
    p_actor_type text, p_actor_id text, p_ts text, p_request_id text
) RETURNS TABLE (moved_from text, moved_next_run_at timestamptz, moved jobs)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    s_running CONSTANT text := 'running';
BEGIN
    RETURN QUERY
    WITH locked AS (
        SELECT jobs.id, jobs.status, jobs.next_run_at, jobs.audit_head,
               jobs_entry_payload(
                   jobs.id, jobs.audit_seq + 1, jobs.correlation_id, jobs.type, jobs.org_id,
                   jobs.project_id,
                   jsonb_build_object(
                       'from', jobs.status, 'to', 'retrying', 'attempt', jobs.attempts
                   ) || i.data,
                   'reclaimed', p_actor_type, p_actor_id, p_ts, p_request_id
               ) AS payload
        FROM (SELECT * FROM unnest(p_ids, p_data)
              AS u(id, data) ORDER BY u.id) AS i
        CROSS JOIN LATERAL (
            SELECT * FROM jobs
            WHERE jobs.id = i.id
              AND jobs.status = s_running
              AND jobs.locked_at < now() - make_interval(secs => p_stale_after)
            FOR UPDATE
        ) AS jobs
    ),
    upd AS (
        UPDATE jobs SET
            status = 'retrying',
            version = jobs.version + 1,
            updated_at = now(),
            locked_by = NULL,
            locked_at = NULL,
            next_run_at = now(),
            last_error_code = p_code,
            last_error_message = p_message,
            audit_seq = jobs.audit_seq + 1,
            audit_head = audit_chain_hash(locked.audit_head, locked.payload)
        FROM locked
        WHERE jobs.id = locked.id
        RETURNING locked.status::text AS status_from, locked.next_run_at AS next_run_from,
                  locked.payload, locked.audit_head AS prev_hash, jobs AS job,
                  jobs.id AS job_id, jobs.audit_part AS part, jobs.audit_seq AS seq,
                  jobs_status_event(jobs, NULL, locked.status::text, p_ts) AS event
    )
    SELECT upd.status_from, upd.next_run_from, upd.job
    FROM upd
    WHERE (SELECT jobs_changes_record(
               array_agg(job_id), array_agg(part), array_agg(seq), array_agg(event), array_agg(payload),
               array_agg(prev_hash),
               'reclaimed', p_actor_type, p_actor_id, p_ts) FROM upd) >= 0;
END;
$$;


-- A worker hands back a `queued` job it may not run now (its organisation is
-- suspended) -> `pending`, without spending an attempt, audited `held`; the
-- dispatcher publishes it again once it may run (NOTIFY jobs_pending).
CREATE OR REPLACE FUNCTION jobs_hold(
    p_ids uuid[], p_data jsonb[], p_actor_type text, p_actor_id text, p_ts text,
    p_request_id text
) RETURNS TABLE (moved_from text, moved_next_run_at timestamptz, moved jobs)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    s_queued CONSTANT text := 'queued';
BEGIN
    RETURN QUERY
    WITH locked AS (
        SELECT jobs.id, jobs.status, jobs.next_run_at, jobs.audit_head,
               jobs_entry_payload(
                   jobs.id, jobs.audit_seq + 1, jobs.correlation_id, jobs.type, jobs.org_id,
                   jobs.project_id,
                   jsonb_build_object(
                       'from', jobs.status, 'to', 'pending', 'attempt', jobs.attempts
                   ) || i.data,
                   'held', p_actor_type, p_actor_id, p_ts, p_request_id
               ) AS payload
        FROM (SELECT * FROM unnest(p_ids, p_data)
              AS u(id, data) ORDER BY u.id) AS i
        CROSS JOIN LATERAL (
            SELECT * FROM jobs
            WHERE jobs.id = i.id
              AND jobs.status = s_queued
            FOR UPDATE
        ) AS jobs
    ),
    upd AS (
        UPDATE jobs SET
            status = 'pending',
            version = jobs.version + 1,
            updated_at = now(),
            locked_by = NULL,
            locked_at = NULL,
            audit_seq = jobs.audit_seq + 1,
            audit_head = audit_chain_hash(locked.audit_head, locked.payload)
        FROM locked
        WHERE jobs.id = locked.id
        RETURNING locked.status::text AS status_from, locked.next_run_at AS next_run_from,
                  locked.payload, locked.audit_head AS prev_hash, jobs AS job,
                  jobs.id AS job_id, jobs.audit_part AS part, jobs.audit_seq AS seq,
                  jobs_status_event(jobs, NULL, locked.status::text, p_ts) AS event
    )
    SELECT upd.status_from, upd.next_run_from, upd.job
    FROM upd
    WHERE (SELECT jobs_changes_record(
               array_agg(job_id), array_agg(part), array_agg(seq), array_agg(event), array_agg(payload),
               array_agg(prev_hash),
               'held', p_actor_type, p_actor_id, p_ts) FROM upd) >= 0;
    IF FOUND THEN
        PERFORM pg_notify('jobs_pending', '');
    END IF;
END;
$$;


-- The publisher, on the broker's confirm: `p_source` (`pending`, or a due `retrying`
-- the dispatcher republished) -> `queued`. A job that moved on meanwhile is left.
CREATE OR REPLACE FUNCTION jobs_mark_queued(
    p_ids uuid[], p_source text, p_data jsonb[], p_actor_type text, p_actor_id text,
    p_ts text, p_request_id text
) RETURNS TABLE (moved_from text, moved_next_run_at timestamptz, moved jobs)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN QUERY
    WITH locked AS (
        SELECT jobs.id, jobs.status, jobs.next_run_at, jobs.audit_head,
               jobs_entry_payload(
                   jobs.id, jobs.audit_seq + 1, jobs.correlation_id, jobs.type, jobs.org_id,
                   jobs.project_id,
                   jsonb_build_object(
                       'from', jobs.status, 'to', 'queued', 'attempt', jobs.attempts
                   ) || i.data,
                   'queued', p_actor_type, p_actor_id, p_ts, p_request_id
               ) AS payload
        FROM (SELECT * FROM unnest(p_ids, p_data)
              AS u(id, data) ORDER BY u.id) AS i
        CROSS JOIN LATERAL (
            SELECT * FROM jobs
            WHERE jobs.id = i.id
              AND jobs.status = p_source
            FOR UPDATE
        ) AS jobs
    ),
    upd AS (
        UPDATE jobs SET
            status = 'queued',
            version = jobs.version + 1,
            updated_at = now(),
            locked_by = NULL,
            locked_at = NULL,
            audit_seq = jobs.audit_seq + 1,
            audit_head = audit_chain_hash(locked.audit_head, locked.payload)
        FROM locked
        WHERE jobs.id = locked.id
        RETURNING locked.status::text AS status_from, locked.next_run_at AS next_run_from,
                  locked.payload, locked.audit_head AS prev_hash, jobs AS job,
                  jobs.id AS job_id, jobs.audit_part AS part, jobs.audit_seq AS seq,
                  jobs_status_event(jobs, NULL, locked.status::text, p_ts) AS event
    )
    SELECT upd.status_from, upd.next_run_from, upd.job
    FROM upd
    WHERE (SELECT jobs_changes_record(
               array_agg(job_id), array_agg(part), array_agg(seq), array_agg(event), array_agg(payload),
               array_agg(prev_hash),
               'queued', p_actor_type, p_actor_id, p_ts) FROM upd) >= 0;
END;
$$;


-- The dispatcher's schedule step: a `scheduled` job whose run_at came -> `pending`,
-- audited `due`; NOTIFY jobs_pending wakes the publisher.
CREATE OR REPLACE FUNCTION jobs_promote_due(
    p_ids uuid[], p_data jsonb[], p_actor_type text, p_actor_id text, p_ts text,
    p_request_id text
) RETURNS TABLE (moved_from text, moved_next_run_at timestamptz, moved jobs)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    s_scheduled CONSTANT text := 'scheduled';
BEGIN
    RETURN QUERY
    WITH locked AS (
        SELECT jobs.id, jobs.status, jobs.next_run_at, jobs.audit_head,
               jobs_entry_payload(
                   jobs.id, jobs.audit_seq + 1, jobs.correlation_id, jobs.type, jobs.org_id,
                   jobs.project_id,
                   jsonb_build_object(
                       'from', jobs.status, 'to', 'pending', 'attempt', jobs.attempts
                   ) || i.data,
                   'due', p_actor_type, p_actor_id, p_ts, p_request_id
               ) AS payload
        FROM (SELECT * FROM unnest(p_ids, p_data)
              AS u(id, data) ORDER BY u.id) AS i
        CROSS JOIN LATERAL (
            SELECT * FROM jobs
            WHERE jobs.id = i.id
              AND jobs.status = s_scheduled
            FOR UPDATE
        ) AS jobs
    ),
    upd AS (
        UPDATE jobs SET
            status = 'pending',
            version = jobs.version + 1,
            updated_at = now(),
            locked_by = NULL,
            locked_at = NULL,
            audit_seq = jobs.audit_seq + 1,
            audit_head = audit_chain_hash(locked.audit_head, locked.payload)
        FROM locked
        WHERE jobs.id = locked.id
        RETURNING locked.status::text AS status_from, locked.next_run_at AS next_run_from,
                  locked.payload, locked.audit_head AS prev_hash, jobs AS job,
                  jobs.id AS job_id, jobs.audit_part AS part, jobs.audit_seq AS seq,
                  jobs_status_event(jobs, NULL, locked.status::text, p_ts) AS event
    )
    SELECT upd.status_from, upd.next_run_from, upd.job
    FROM upd
    WHERE (SELECT jobs_changes_record(
               array_agg(job_id), array_agg(part), array_agg(seq), array_agg(event), array_agg(payload),
               array_agg(prev_hash),
               'due', p_actor_type, p_actor_id, p_ts) FROM upd) >= 0;
    IF FOUND THEN
        PERFORM pg_notify('jobs_pending', '');
    END IF;
END;
$$;


-- Put an ended job back in line: `failed` -> `pending` with `p_extend` more attempts,
-- its dead-letter queue, result and progress cleared, audited `p_event_type` (an
-- operator's replay, an owner's retry); NOTIFY jobs_pending wakes the publisher.
CREATE OR REPLACE FUNCTION jobs_requeue(
    p_ids uuid[], p_extend int, p_event_type text, p_data jsonb[], p_actor_type text,
    p_actor_id text, p_ts text, p_request_id text
) RETURNS TABLE (moved_from text, moved_next_run_at timestamptz, moved jobs)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN QUERY
    WITH locked AS (
        SELECT jobs.id, jobs.status, jobs.next_run_at, jobs.audit_head,
               jobs_entry_payload(
                   jobs.id, jobs.audit_seq + 1, jobs.correlation_id, jobs.type, jobs.org_id,
                   jobs.project_id,
                   jsonb_build_object(
                       'from', jobs.status, 'to', 'pending', 'attempt', jobs.attempts
                   ) || i.data,
                   p_event_type, p_actor_type, p_actor_id, p_ts, p_request_id
               ) AS payload
        FROM (SELECT * FROM unnest(p_ids, p_data)
              AS u(id, data) ORDER BY u.id) AS i
        CROSS JOIN LATERAL (
            SELECT * FROM jobs
            WHERE jobs.id = i.id
              AND jobs.status = 'failed'
            FOR UPDATE
        ) AS jobs
    ),
    upd AS (
        UPDATE jobs SET
            status = 'pending',
            version = jobs.version + 1,
            updated_at = now(),
            locked_by = NULL,
            locked_at = NULL,
            max_attempts = jobs.max_attempts + p_extend,
            dead_letter_queue = NULL,
            next_run_at = NULL,
            result = NULL,
            progress_percent = 0,
            progress_step = NULL,
            progress_message = NULL,
            progress_metrics = NULL,
            audit_seq = jobs.audit_seq + 1,
            audit_head = audit_chain_hash(locked.audit_head, locked.payload)
        FROM locked
        WHERE jobs.id = locked.id
        RETURNING locked.status::text AS status_from, locked.next_run_at AS next_run_from,
                  locked.payload, locked.audit_head AS prev_hash, jobs AS job,
                  jobs.id AS job_id, jobs.audit_part AS part, jobs.audit_seq AS seq,
                  jobs_status_event(jobs, NULL, locked.status::text, p_ts) AS event
    )
    SELECT upd.status_from, upd.next_run_from, upd.job
    FROM upd
    WHERE (SELECT jobs_changes_record(
               array_agg(job_id), array_agg(part), array_agg(seq), array_agg(event), array_agg(payload),
               array_agg(prev_hash),
               p_event_type, p_actor_type, p_actor_id, p_ts) FROM upd) >= 0;
    IF FOUND THEN
        PERFORM pg_notify('jobs_pending', '');
    END IF;
END;
$$;


-- jobs_requeue with each job's params replaced (`p_params`, their hash
-- `p_params_hashes`): an operator's fix-forward.
CREATE OR REPLACE FUNCTION jobs_requeue_with_params(
    p_ids uuid[], p_params jsonb[], p_params_hashes text[], p_extend int,
    p_event_type text, p_data jsonb[], p_actor_type text, p_actor_id text, p_ts text,
    p_request_id text
) RETURNS TABLE (moved_from text, moved_next_run_at timestamptz, moved jobs)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN QUERY
    WITH locked AS (
        SELECT jobs.id, jobs.status, jobs.next_run_at, jobs.audit_head,
               i.params, i.params_hash,
               jobs_entry_payload(
                   jobs.id, jobs.audit_seq + 1, jobs.correlation_id, jobs.type, jobs.org_id,
                   jobs.project_id,
                   jsonb_build_object(
                       'from', jobs.status, 'to', 'pending', 'attempt', jobs.attempts
                   ) || i.data,
                   p_event_type, p_actor_type, p_actor_id, p_ts, p_request_id
               ) AS payload
        FROM (SELECT * FROM unnest(p_ids, p_params, p_params_hashes, p_data)
              AS u(id, params, params_hash, data) ORDER BY u.id) AS i
        CROSS JOIN LATERAL (
            SELECT * FROM jobs
            WHERE jobs.id = i.id
              AND jobs.status = 'failed'
            FOR UPDATE
        ) AS jobs
    ),
    upd AS (
        UPDATE jobs SET
            status = 'pending',
            version = jobs.version + 1,
            updated_at = now(),
            locked_by = NULL,
            locked_at = NULL,
            max_attempts = jobs.max_attempts + p_extend,
            dead_letter_queue = NULL,
            next_run_at = NULL,
            result = NULL,
            progress_percent = 0,
            progress_step = NULL,
            progress_message = NULL,
            progress_metrics = NULL,
            params = locked.params,
            params_hash = locked.params_hash,
            audit_seq = jobs.audit_seq + 1,
            audit_head = audit_chain_hash(locked.audit_head, locked.payload)
        FROM locked
        WHERE jobs.id = locked.id
        RETURNING locked.status::text AS status_from, locked.next_run_at AS next_run_from,
                  locked.payload, locked.audit_head AS prev_hash, jobs AS job,
                  jobs.id AS job_id, jobs.audit_part AS part, jobs.audit_seq AS seq,
                  jobs_status_event(jobs, NULL, locked.status::text, p_ts) AS event
    )
    SELECT upd.status_from, upd.next_run_from, upd.job
    FROM upd
    WHERE (SELECT jobs_changes_record(
               array_agg(job_id), array_agg(part), array_agg(seq), array_agg(event), array_agg(payload),
               array_agg(prev_hash),
               p_event_type, p_actor_type, p_actor_id, p_ts) FROM upd) >= 0;
    IF FOUND THEN
        PERFORM pg_notify('jobs_pending', '');
    END IF;
END;
$$;


-- An entry that changes nothing of the job (dead_lettered, dlq_discarded, rerun,
-- purged, fix-forward decisions: `p_event_type`) on each job's chain; no version, no
-- event.
CREATE OR REPLACE FUNCTION jobs_note(
    p_ids uuid[], p_event_type text, p_data jsonb[], p_actor_type text, p_actor_id text,
    p_ts text, p_request_id text
) RETURNS TABLE (moved_from text, moved_next_run_at timestamptz, moved jobs)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN QUERY
    WITH locked AS (
        SELECT jobs.id, jobs.status, jobs.next_run_at, jobs.audit_head,
               jobs_entry_payload(
                   jobs.id, jobs.audit_seq + 1, jobs.correlation_id, jobs.type, jobs.org_id,
                   jobs.project_id,
                   jsonb_build_object('attempt', jobs.attempts) || i.data,
                   p_event_type, p_actor_type, p_actor_id, p_ts, p_request_id
               ) AS payload
        FROM (SELECT * FROM unnest(p_ids, p_data)
              AS u(id, data) ORDER BY u.id) AS i
        CROSS JOIN LATERAL (
            SELECT * FROM jobs
            WHERE jobs.id = i.id
            FOR UPDATE
        ) AS jobs
    ),
    upd AS (
        UPDATE jobs SET
            status = jobs.status,
            audit_seq = jobs.audit_seq + 1,
            audit_head = audit_chain_hash(locked.audit_head, locked.payload)
        FROM locked
        WHERE jobs.id = locked.id
        RETURNING locked.status::text AS status_from, locked.next_run_at AS next_run_from,
                  locked.payload, locked.audit_head AS prev_hash, jobs AS job,
                  jobs.id AS job_id, jobs.audit_part AS part, jobs.audit_seq AS seq
    )
    SELECT upd.status_from, upd.next_run_from, upd.job
    FROM upd
    WHERE (SELECT audit_append_job_entries(
               array_agg(job_id), array_agg(part), array_agg(seq), array_agg(payload), array_agg(prev_hash),
               p_event_type, p_actor_type, p_actor_id, p_ts::timestamptz) FROM upd) >= 0;
END;
$$;


-- An entry a running job's handler appends to its own chain (`p_event_type`: annotated,
-- jobs.services.annotations), fenced as every write of a worker: only while the caller
-- still holds the lock and attempt. Changes nothing else of the job; no version, no
-- event (as jobs_note).
CREATE OR REPLACE FUNCTION jobs_note_fenced(
    p_ids uuid[], p_attempts int[], p_locked_by text, p_event_type text, p_data jsonb[],
    p_actor_type text, p_actor_id text, p_ts text, p_request_id text
) RETURNS TABLE (moved_from text, moved_next_run_at timestamptz, moved jobs)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    s_running CONSTANT text := 'running';
BEGIN
    RETURN QUERY
    WITH locked AS (
        SELECT jobs.id, jobs.status, jobs.next_run_at, jobs.audit_head,
               jobs_entry_payload(
                   jobs.id, jobs.audit_seq + 1, jobs.correlation_id, jobs.type, jobs.org_id,
                   jobs.project_id,
                   jsonb_build_object('attempt', jobs.attempts) || i.data,
                   p_event_type, p_actor_type, p_actor_id, p_ts, p_request_id
               ) AS payload
        FROM (SELECT * FROM unnest(p_ids, p_attempts, p_data)
              AS u(id, attempt, data) ORDER BY u.id) AS i
        CROSS JOIN LATERAL (
            SELECT * FROM jobs
            WHERE jobs.id = i.id
              AND jobs.status = s_running AND jobs.locked_by = p_locked_by
              AND jobs.attempts = i.attempt
            FOR UPDATE
        ) AS jobs
    ),
    upd AS (
        UPDATE jobs SET
            audit_seq = jobs.audit_seq + 1,
            audit_head = audit_chain_hash(locked.audit_head, locked.payload)
        FROM locked
        WHERE jobs.id = locked.id
        RETURNING locked.status::text AS status_from, locked.next_run_at AS next_run_from,
                  locked.payload, locked.audit_head AS prev_hash, jobs AS job,
                  jobs.id AS job_id, jobs.audit_part AS part, jobs.audit_seq AS seq
    )
    SELECT upd.status_from, upd.next_run_from, upd.job
    FROM upd
    WHERE (SELECT audit_append_job_entries(
               array_agg(job_id), array_agg(part), array_agg(seq), array_agg(payload), array_agg(prev_hash),
               p_event_type, p_actor_type, p_actor_id, p_ts::timestamptz) FROM upd) >= 0;
END;
$$;
