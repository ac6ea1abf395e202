-- What every transition function (jobs/sql/20_transitions.sql) writes besides the row:
-- the audit entry of each changed job and, for a change of status, its event. Installed
-- after migrations by core/sqlfiles.py; each statement is idempotent.

-- jobs_entry_context: the `context` of a job's audit entry (docs/tenancy.md#audit): its
-- tenant and identity, and the request that made the change (job_insert writes the
-- first entry's from the values it inserts, jobs_entry_payload every other's).
CREATE OR REPLACE FUNCTION jobs_entry_context(
    p_correlation_id text, p_job_type text, p_org_id bigint, p_project_id bigint,
    p_request_id text
) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT jsonb_build_object(
        'correlation_id', p_correlation_id, 'job_type', p_job_type, 'org_id', p_org_id,
        'project_id', p_project_id, 'request_id', p_request_id
    )
$$;

-- jobs_entry_payload: the canonical payload (the audit app's audit_entry_payload, the
-- one builder of what an entry hashes) of the entry a change appends to `p_job`'s chain,
-- from the row before the change (its next seq, its context) and the entry's data
-- (`p_data`: what the transition says, e.g. from, to, attempt, and the caller's).
CREATE OR REPLACE FUNCTION jobs_entry_payload(
    p_job jobs, p_data jsonb, p_event_type text, p_actor_type text, p_actor_id text,
    p_ts text, p_request_id text
) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT audit_entry_payload(
        audit_job_chain(p_job.id), p_job.audit_seq + 1, p_ts, p_event_type, p_actor_type,
        p_actor_id, p_job.id,
        p_data || jsonb_build_object('context', jobs_entry_context(
            p_job.correlation_id, p_job.type, p_job.org_id, p_job.project_id, p_request_id
        ))
    )
$$;

-- jobs_entries_append: each changed job's entry (`p_jobs`: the rows after the change,
-- their audit_seq the entry's), continuing its chain from `p_prev_hashes`, in one
-- statement for the whole batch (the audit app's audit_append_entries: the checkpoint
-- barrier once, one INSERT, continuity checked by its statement trigger). Returns how
-- many were appended (the caller reads it, so that the call is never optimised away).
CREATE OR REPLACE FUNCTION jobs_entries_append(
    p_jobs jobs[], p_payloads text[], p_prev_hashes text[], p_event_type text,
    p_actor_type text, p_actor_id text, p_ts text
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    appended bigint;
BEGIN
    -- PL/pgSQL, not SQL: its statements' plans are kept for the session, where a SQL
    -- function that is not inlined is planned again at every call.
    SELECT count(*) INTO appended
    FROM (
        SELECT array_agg(audit_job_chain(p_jobs[n].id) ORDER BY n) AS chains,
               array_agg(p_jobs[n].id ORDER BY n) AS ids,
               array_agg(p_jobs[n].audit_seq::bigint ORDER BY n) AS seqs,
               array_agg(p_event_type ORDER BY n) AS event_types,
               array_agg(p_actor_type ORDER BY n) AS actor_types,
               array_agg(p_actor_id ORDER BY n) AS actor_ids,
               array_agg(p_ts::timestamptz ORDER BY n) AS ts
        FROM generate_subscripts(p_jobs, 1) AS n
    ) AS e
    CROSS JOIN LATERAL audit_append_entries(
        e.chains, e.ids, e.seqs, e.event_types, e.actor_types, e.actor_ids, e.ts,
        p_payloads, p_prev_hashes
    ) AS entry;
    RETURN appended;
END;
$$;

-- jobs_changes_record: jobs_entries_append, and each job's job.status.changed event
-- in the outbox (jobs_status_event; `p_from`: the status each left). A volatile call
-- in a subquery's select list runs once per row: one event id each. (Subscripts, not
-- unnest: unnest spreads an array of rows into their columns.)
CREATE OR REPLACE FUNCTION jobs_changes_record(
    p_jobs jobs[], p_from text[], p_payloads text[], p_prev_hashes text[],
    p_event_type text, p_actor_type text, p_actor_id text, p_ts text
) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO event_outbox (event_id, job_id, seq, payload, created_at)
    SELECT e.eid, p_jobs[e.n].id, p_jobs[e.n].audit_seq,
           jobs_status_event(p_jobs[e.n], e.eid, p_from[e.n], p_ts), now()
    FROM (SELECT n, gen_random_uuid() AS eid FROM generate_subscripts(p_jobs, 1) AS n) AS e;
    RETURN jobs_entries_append(
        p_jobs, p_payloads, p_prev_hashes, p_event_type, p_actor_type, p_actor_id, p_ts
    );
END;
$$;
