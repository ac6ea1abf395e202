"""The postgres executor's batch completions (docs/postgres-executor.md).

`jobs_entries` takes a seventh array: each job's own values of a batch transition (its
fence's attempt, result, error, retry delay, last progress value), as JSON text, NULL
for a job that has none. job_append applies them in place of the statement's one value,
so that a window of finished jobs of one outcome is one statement: each job's
compare-and-set fenced by its own attempt, each its own entry and event.
"""

from django.db import migrations

FUNCTIONS = """
DROP FUNCTION IF EXISTS jobs_entries(text[], text[], text[], text[], text[], text[]);
CREATE OR REPLACE FUNCTION jobs_entries(
    a_ids text[], a_p0 text[], a_p1 text[], a_p2 text[], a_p3 text[], a_p4 text[],
    a_v text[]
) RETURNS TABLE (id uuid, p0 text, p1 text, p2 text, p3 text, p4 text, v jsonb)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE ROWS 1 AS $$
BEGIN
    RETURN QUERY SELECT * FROM unnest(a_ids::uuid[], a_p0, a_p1, a_p2, a_p3, a_p4, a_v::jsonb[]);
END;
$$;
"""

REVERSE = """
DROP FUNCTION IF EXISTS jobs_entries(text[], text[], text[], text[], text[], text[], text[]);
CREATE OR REPLACE FUNCTION jobs_entries(
    a_ids text[], a_p0 text[], a_p1 text[], a_p2 text[], a_p3 text[], a_p4 text[]
) RETURNS TABLE (id uuid, p0 text, p1 text, p2 text, p3 text, p4 text)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE ROWS 1 AS $$
BEGIN
    RETURN QUERY SELECT * FROM unnest(a_ids::uuid[], a_p0, a_p1, a_p2, a_p3, a_p4);
END;
$$;
"""


class Migration(migrations.Migration):
    dependencies = [("jobs", "0019_connectors")]

    operations = [migrations.RunSQL(FUNCTIONS, REVERSE)]
