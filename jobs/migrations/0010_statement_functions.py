"""Two SQL functions of the jobs app's statements (jobs/queries.sql).

- `jobs_status_event(job, event_id, previous_status, ts)`: the job.status.changed event
  body (docs/architecture.md#progress-events-and-the-outbox). Both statements that
  write the outbox (a job's creation and every transition) build the event from the
  job's row with it, so that its fields are written once. Plain SQL: the planner
  inlines it.
- `jobs_entries(ids, p0, p1, p2, p3)`: the rows of job_append's arrays (a job id and
  its payload pieces), declared ROWS 1. A worker's claim and finish are one job each
  and run most often; PostgreSQL keeps a prepared statement's generic plan only when
  it is no dearer than planning anew, and a generic plan estimates an array
  parameter's unnest at 10 rows, which made the planner plan the statement again on
  every execution (that cost more than running it). Behind a function that says one
  row, the generic plan (primary-key lookups, a nested loop) is the one a one-job
  statement gets, and a batch runs the same plan. PL/pgSQL so that it is not inlined
  (inlining would bring the estimate of 10 back).
"""

from django.db import migrations

FUNCTION = """
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

FUNCTION += """
CREATE OR REPLACE FUNCTION jobs_entries(
    a_ids text[], a_p0 text[], a_p1 text[], a_p2 text[], a_p3 text[]
) RETURNS TABLE (id uuid, p0 text, p1 text, p2 text, p3 text)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE ROWS 1 AS $$
BEGIN
    RETURN QUERY SELECT * FROM unnest(a_ids::uuid[], a_p0, a_p1, a_p2, a_p3);
END;
$$;
"""

REVERSE = """
DROP FUNCTION IF EXISTS jobs_entries(text[], text[], text[], text[], text[]);
DROP FUNCTION IF EXISTS jobs_status_event(jobs, uuid, text, text);
"""


class Migration(migrations.Migration):
    dependencies = [("jobs", "0009_artefact_storage")]

    operations = [migrations.RunSQL(FUNCTION, REVERSE)]
