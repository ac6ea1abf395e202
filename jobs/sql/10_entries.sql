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
-- the layout of what an entry hashes) of the entry `p_seq` a change appends to job
-- `p_id`'s chain, its context from the job's identity as the row holds it before the
-- change, and the entry's data (`p_data`: what the transition says, e.g. from, to,
-- attempt, and the caller's). The data of most entries is exactly from, to and attempt:
-- composed here by concatenation. Any other data goes through jobs_entry_data, or
-- audit_canonical when its keys are not all known (no data: `{}`, as
-- audit_entry_payload writes it).
-- PL/pgSQL: `p_data` is computed once, where an inlined SQL body would repeat the
-- caller's expression for it at each reference. And it keeps jobs_entry_data, hundreds
-- of expression nodes, out of the common case: PL/pgSQL prepares a statement's
-- expression at its first run in each transaction, which for jobs_entry_data cost
-- ~0.13 ms, most of what a one-job transition (a Celery delivery's claim, its end)
-- spent composing its entry.
CREATE OR REPLACE FUNCTION jobs_entry_payload(
    p_id uuid, p_seq bigint, p_correlation_id text, p_job_type text, p_org_id bigint,
    p_project_id bigint, p_data jsonb, p_event_type text, p_actor_type text,
    p_actor_id text, p_ts text, p_request_id text
) RETURNS text
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
DECLARE
    context text := jobs_entry_context_jcs(
        p_correlation_id, p_job_type, p_org_id, p_project_id, p_request_id
    );
    data text;
BEGIN
    -- from and to are strings (jsonb writes a string as JCS does), attempt an integer
    -- within JCS's safe range (digits, as audit_jcs_number writes it).
    IF jsonb_typeof(p_data) = 'object' AND p_data - '{attempt,from,to}'::text[] = '{}'
       AND p_data ?& '{attempt,from,to}'
       AND jsonb_typeof(p_data -> 'from') = 'string'
       AND jsonb_typeof(p_data -> 'to') = 'string'
       AND (p_data -> 'attempt')::text ~ '^[0-9]{1,15}$' THEN
        data := '{"attempt":' || (p_data -> 'attempt')::text || ',"context":' || context
            || ',"from":' || (p_data -> 'from')::text || ',"to":' || (p_data -> 'to')::text
            || '}';
    ELSE
        data := coalesce(
            jobs_entry_data(p_data, context),
            audit_canonical(p_data || jsonb_build_object('context', jobs_entry_context(
                p_correlation_id, p_job_type, p_org_id, p_project_id, p_request_id
            ))),
            '{}'
        );
    END IF;
    RETURN audit_entry_payload_jcs(
        audit_job_chain(p_id), p_seq, p_ts, p_event_type, p_actor_type, p_actor_id, p_id,
        data
    );
END;
$$;

-- jobs_events_on: whether this session writes job events to the outbox. A process with
-- JOBOPS_EVENTS_PUBLISH off starts each connection with `-c jobops.events=off`
-- (config/settings.py); unset (every other session, an older release's process during
-- a rollout, psql) means on. One lookup of a session setting, no query.
CREATE OR REPLACE FUNCTION jobs_events_on() RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(current_setting('jobops.events', true), '') <> 'off'
$$;

-- jobs_progress_event: the job.progress event of a progress write (jobs_progress), built
-- from the job's row after the write: `progress` is the object the row holds (percent,
-- step, message), `seq` its `progress` entry's. It names the job's type, organisation,
-- project and request as jobs_status_event does. `p_metrics` (a handler's measurements,
-- when a write carries some) becomes `metrics`, left out when NULL. The event stream
-- (jobs/stream) builds the same body from the entry and the row: tests/jobs/
-- test_progress_events.py holds the two equal.
CREATE OR REPLACE FUNCTION jobs_progress_event(job jobs, p_ts text, p_metrics jsonb)
RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT jsonb_build_object(
        'type', 'job.progress', 'job_id', job.id::text, 'job_type', job.type,
        'seq', job.audit_seq, 'status', job.status,
        'progress', jsonb_build_object(
            'percent', job.progress_percent, 'step', job.progress_step,
            'message', job.progress_message
        ),
        'attempt', job.attempts, 'timestamp', p_ts,
        'request_id', job.request_id, 'correlation_id', job.correlation_id,
        'org_id', job.org_id, 'project_id', job.project_id
    ) || CASE WHEN p_metrics IS NULL THEN '{}'::jsonb
              ELSE jsonb_build_object('metrics', p_metrics) END
$$;

-- jobs_changes_record: each changed job's entry (`p_ids` with `p_parts`, their rows'
-- audit_part: the partition of the job's chain, and `p_seqs`, their rows'
-- audit_seq after the change: the entries' seq), continuing its chain from
-- `p_prev_hashes`, in one statement for the whole batch (the audit app's
-- audit_append_job_entries), and its event (`p_events`: jobs_status_event of its row
-- after the change, which this names, or jobs_progress_event for a progress write) in
-- the outbox.
-- Returns how many entries were appended (the caller reads it, so that the call is never
-- optimised away). A volatile call in a subquery's select list runs once per row: one
-- event id each. No event where the session says `jobops.events = off`
-- (JOBOPS_EVENTS_PUBLISH off: no consumer of events anywhere; jobs_events_on); the
-- entries are the same either way.
CREATE OR REPLACE FUNCTION jobs_changes_record(
    p_ids uuid[], p_parts date[], p_seqs bigint[], p_events jsonb[], p_payloads text[],
    p_prev_hashes text[], p_event_type text, p_actor_type text, p_actor_id text, p_ts text
) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF jobs_events_on() THEN
        INSERT INTO event_outbox (event_id, job_id, seq, payload, created_at)
        SELECT e.eid, e.id, e.seq, e.event || jsonb_build_object('event_id', e.eid::text),
               now()
        FROM (SELECT u.*, gen_random_uuid() AS eid
              FROM unnest(p_ids, p_seqs, p_events) AS u(id, seq, event)) AS e;
    END IF;
    RETURN audit_append_job_entries(
        p_ids, p_parts, p_seqs, p_payloads, p_prev_hashes, p_event_type, p_actor_type, p_actor_id,
        p_ts::timestamptz
    );
END;
$$;
