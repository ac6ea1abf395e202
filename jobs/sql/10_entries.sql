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

-- jobs_entry_context_jcs: the RFC 8785 text of jobs_entry_context's object, by
-- concatenation (its keys are fixed, in JCS order; the ids as audit_jcs_number writes
-- them).
CREATE OR REPLACE FUNCTION jobs_entry_context_jcs(
    p_correlation_id text, p_job_type text, p_org_id bigint, p_project_id bigint,
    p_request_id text
) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT '{"correlation_id":' || coalesce(to_jsonb(p_correlation_id)::text, 'null')
        || ',"job_type":' || coalesce(to_jsonb(p_job_type)::text, 'null')
        || ',"org_id":' || coalesce(audit_jcs_number(p_org_id), 'null')
        || ',"project_id":' || coalesce(audit_jcs_number(p_project_id), 'null')
        || ',"request_id":' || coalesce(to_jsonb(p_request_id)::text, 'null') || '}'
$$;

-- jobs_entry_data: the RFC 8785 text of an entry's data (`p_data`) with its `context`
-- (`p_context`, RFC 8785 text already), by concatenation in JCS key order, when every
-- key of `p_data` is one the jobs app writes (listed here, in UTF-8 byte order, which is
-- UTF-16 order for ASCII keys); NULL for any other data, which jobs_entry_payload then
-- gives to audit_canonical whole. One expression, no query, so that the planner inlines
-- it: audit_canonical runs a query per object, the cost that made the SQL builder the
-- larger part of a batch's append. Each value through audit_jcs_member (a nested value
-- through audit_canonical). tests/jobs/test_entry_payload.py holds it byte-equal to
-- rfc8785.
CREATE OR REPLACE FUNCTION jobs_entry_data(p_data jsonb, p_context text) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN jsonb_typeof(p_data) = 'object'
                     AND p_data - '{approved_by,attempt,attempt_given_back,attempts_extended,breaker,category,changed_paths,connector,context,dead_letter_id,delay_ms,error_code,from,justification,justification_sha256,message_id,new_params_sha256,old_params_sha256,params_edit_id,percent,queue,reason,requested_by,rerun_job_id,rerun_of,status,step,to}'::text[] = '{}' THEN '{' || concat_ws(',',
        CASE WHEN p_data ? 'approved_by' THEN '"approved_by":' || audit_jcs_member(p_data -> 'approved_by') END,
        CASE WHEN p_data ? 'attempt' THEN '"attempt":' || audit_jcs_member(p_data -> 'attempt') END,
        CASE WHEN p_data ? 'attempt_given_back' THEN '"attempt_given_back":' || audit_jcs_member(p_data -> 'attempt_given_back') END,
        CASE WHEN p_data ? 'attempts_extended' THEN '"attempts_extended":' || audit_jcs_member(p_data -> 'attempts_extended') END,
        CASE WHEN p_data ? 'breaker' THEN '"breaker":' || audit_jcs_member(p_data -> 'breaker') END,
        CASE WHEN p_data ? 'category' THEN '"category":' || audit_jcs_member(p_data -> 'category') END,
        CASE WHEN p_data ? 'changed_paths' THEN '"changed_paths":' || audit_jcs_member(p_data -> 'changed_paths') END,
        CASE WHEN p_data ? 'connector' THEN '"connector":' || audit_jcs_member(p_data -> 'connector') END,
        '"context":' || p_context,
        CASE WHEN p_data ? 'dead_letter_id' THEN '"dead_letter_id":' || audit_jcs_member(p_data -> 'dead_letter_id') END,
        CASE WHEN p_data ? 'delay_ms' THEN '"delay_ms":' || audit_jcs_member(p_data -> 'delay_ms') END,
        CASE WHEN p_data ? 'error_code' THEN '"error_code":' || audit_jcs_member(p_data -> 'error_code') END,
        CASE WHEN p_data ? 'from' THEN '"from":' || audit_jcs_member(p_data -> 'from') END,
        CASE WHEN p_data ? 'justification' THEN '"justification":' || audit_jcs_member(p_data -> 'justification') END,
        CASE WHEN p_data ? 'justification_sha256' THEN '"justification_sha256":' || audit_jcs_member(p_data -> 'justification_sha256') END,
        CASE WHEN p_data ? 'message_id' THEN '"message_id":' || audit_jcs_member(p_data -> 'message_id') END,
        CASE WHEN p_data ? 'new_params_sha256' THEN '"new_params_sha256":' || audit_jcs_member(p_data -> 'new_params_sha256') END,
        CASE WHEN p_data ? 'old_params_sha256' THEN '"old_params_sha256":' || audit_jcs_member(p_data -> 'old_params_sha256') END,
        CASE WHEN p_data ? 'params_edit_id' THEN '"params_edit_id":' || audit_jcs_member(p_data -> 'params_edit_id') END,
        CASE WHEN p_data ? 'percent' THEN '"percent":' || audit_jcs_member(p_data -> 'percent') END,
        CASE WHEN p_data ? 'queue' THEN '"queue":' || audit_jcs_member(p_data -> 'queue') END,
        CASE WHEN p_data ? 'reason' THEN '"reason":' || audit_jcs_member(p_data -> 'reason') END,
        CASE WHEN p_data ? 'requested_by' THEN '"requested_by":' || audit_jcs_member(p_data -> 'requested_by') END,
        CASE WHEN p_data ? 'rerun_job_id' THEN '"rerun_job_id":' || audit_jcs_member(p_data -> 'rerun_job_id') END,
        CASE WHEN p_data ? 'rerun_of' THEN '"rerun_of":' || audit_jcs_member(p_data -> 'rerun_of') END,
        CASE WHEN p_data ? 'status' THEN '"status":' || audit_jcs_member(p_data -> 'status') END,
        CASE WHEN p_data ? 'step' THEN '"step":' || audit_jcs_member(p_data -> 'step') END,
        CASE WHEN p_data ? 'to' THEN '"to":' || audit_jcs_member(p_data -> 'to') END
    ) || '}' END
$$;

-- jobs_entry_payload: the canonical payload (the audit app's audit_entry_payload_jcs,
-- the layout of what an entry hashes) of the entry a change appends to `p_job`'s chain,
-- from the row before the change (its next seq, its context) and the entry's data
-- (`p_data`: what the transition says, e.g. from, to, attempt, and the caller's): the
-- data through jobs_entry_data, or audit_canonical when its keys are not all known
-- (no data: `{}`, as audit_entry_payload writes it).
-- PL/pgSQL with one RETURN expression (run without a query, as a simple expression):
-- `p_data` is then computed once, where an inlined SQL body would repeat the caller's
-- expression for it at each of jobs_entry_data's references.
CREATE OR REPLACE FUNCTION jobs_entry_payload(
    p_job jobs, p_data jsonb, p_event_type text, p_actor_type text, p_actor_id text,
    p_ts text, p_request_id text
) RETURNS text
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    RETURN audit_entry_payload_jcs(
        audit_job_chain(p_job.id), p_job.audit_seq + 1, p_ts, p_event_type, p_actor_type,
        p_actor_id, p_job.id,
        coalesce(
            jobs_entry_data(p_data, jobs_entry_context_jcs(
                p_job.correlation_id, p_job.type, p_job.org_id, p_job.project_id,
                p_request_id
            )),
            audit_canonical(p_data || jsonb_build_object('context', jobs_entry_context(
                p_job.correlation_id, p_job.type, p_job.org_id, p_job.project_id,
                p_request_id
            ))),
            '{}'
        )
    );
END;
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
