"""The tenant and identity of a job in each of its audit entries and events
(docs/tenancy.md#audit).

- `jobs_audit_context(job, request_id)`: the `context` object of a job's audit entry,
  as RFC 8785 text (the verifier hashes the payload's exact bytes): its keys in JCS
  order, strings through to_json, whose escapes are JCS's (`\\"`, `\\\\`, `\\b \\f \\n
  \\r \\t`, other control characters as lowercase `\\u00xx`), numbers as integers.
  job_append fills it into every entry's payload from the locked row, so that a batch
  of jobs (a publish, a replay) carries each job's own tenant without a read first.
  STABLE, as to_json is: declared IMMUTABLE, the planner would not inline a body with
  a stable call, and a SQL function that is not inlined is planned again at every
  execution of the statement that calls it (0.5 ms of each transition, measured).
- `jobs_entries` takes a fifth piece (an entry has up to four holes now).
- `jobs_status_event` names the organisation and project.
"""

from django.db import migrations

FUNCTIONS = """
CREATE OR REPLACE FUNCTION jobs_audit_context(job jobs, request_id text) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT '{"correlation_id":' || coalesce(to_json(job.correlation_id)::text, 'null')
        || ',"job_type":' || to_json(job.type)::text
        || ',"org_id":' || job.org_id::text
        || ',"project_id":' || coalesce(job.project_id::text, 'null')
        || ',"request_id":' || coalesce(to_json(request_id)::text, 'null') || '}'
$$;

DROP FUNCTION IF EXISTS jobs_entries(text[], text[], text[], text[], text[]);
CREATE OR REPLACE FUNCTION jobs_entries(
    a_ids text[], a_p0 text[], a_p1 text[], a_p2 text[], a_p3 text[], a_p4 text[]
) RETURNS TABLE (id uuid, p0 text, p1 text, p2 text, p3 text, p4 text)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE ROWS 1 AS $$
BEGIN
    RETURN QUERY SELECT * FROM unnest(a_ids::uuid[], a_p0, a_p1, a_p2, a_p3, a_p4);
END;
$$;

CREATE OR REPLACE FUNCTION jobs_status_event(
    job jobs, event_id uuid, previous_status text, ts text
) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT jsonb_build_object(
        'event_id', event_id::text, 'type', 'job.status.changed',
        'job_id', job.id::text, 'job_type', job.type, 'seq', job.audit_seq,
        'status', job.status, 'previous_status', previous_status,
        'progress', job.progress_percent, 'attempt', job.attempts, 'timestamp', ts,
        'request_id', job.request_id, 'correlation_id', job.correlation_id,
        'org_id', job.org_id, 'project_id', job.project_id
    )
$$;
"""

REVERSE = """
DROP FUNCTION IF EXISTS jobs_audit_context(jobs, text);
DROP FUNCTION IF EXISTS jobs_entries(text[], text[], text[], text[], text[], text[]);
CREATE OR REPLACE FUNCTION jobs_entries(
    a_ids text[], a_p0 text[], a_p1 text[], a_p2 text[], a_p3 text[]
) RETURNS TABLE (id uuid, p0 text, p1 text, p2 text, p3 text)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE ROWS 1 AS $$
BEGIN
    RETURN QUERY SELECT * FROM unnest(a_ids::uuid[], a_p0, a_p1, a_p2, a_p3);
END;
$$;
CREATE OR REPLACE FUNCTION jobs_status_event(
    job jobs, event_id uuid, previous_status text, ts text
) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT jsonb_build_object(
        'event_id', event_id::text, 'type', 'job.status.changed',
        'job_id', job.id::text, 'job_type', job.type, 'seq', job.audit_seq,
        'status', job.status, 'previous_status', previous_status,
        'progress', job.progress_percent, 'attempt', job.attempts, 'timestamp', ts,
        'request_id', job.request_id, 'correlation_id', job.correlation_id
    )
$$;
"""


class Migration(migrations.Migration):
    dependencies = [("jobs", "0013_job_tenancy")]

    operations = [migrations.RunSQL(FUNCTIONS, REVERSE)]
