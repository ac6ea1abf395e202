# Purge and the rows that name a purged one (docs/operations/retention.md, issue 37): the
# rule splits in two. `jobs_purge_ended(job, keep)` is 0011's rule (ended, past `keep`,
# no live key, no open dead letter); `jobs_purge_held(job)` says a fix-forward edit of
# the job is still undecided (its decision is in no chain yet, so the edit and the job
# stay, and purge reports them); `jobs_purge_due` is the first and not the second.
# purge_state gains `kept`: what the last finished run kept, and why, for the dashboard.

from django.db import migrations, models

FORWARD = """
CREATE OR REPLACE FUNCTION jobs_purge_ended(job jobs, keep float8) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT job.status IN ('succeeded', 'failed', 'cancelled')
       AND job.updated_at < now() - make_interval(secs => keep)
       AND (job.idempotency_expires_at IS NULL OR job.idempotency_expires_at <= now())
       AND NOT EXISTS (
           SELECT FROM dead_letters d WHERE d.job_id = job.id AND d.state = 'open'
       )
$$;
CREATE OR REPLACE FUNCTION jobs_purge_held(job jobs) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT EXISTS (
        SELECT FROM params_edits e
        WHERE e.job_id = job.id AND e.state NOT IN ('applied', 'rejected')
    )
$$;
CREATE OR REPLACE FUNCTION jobs_purge_due(job jobs, keep float8) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT jobs_purge_ended(job, keep) AND NOT jobs_purge_held(job)
$$;
"""

# 0011's rule again, then the two parts it no longer calls.
REVERSE = """
CREATE OR REPLACE FUNCTION jobs_purge_due(job jobs, keep float8) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT job.status IN ('succeeded', 'failed', 'cancelled')
       AND job.updated_at < now() - make_interval(secs => keep)
       AND (job.idempotency_expires_at IS NULL OR job.idempotency_expires_at <= now())
       AND NOT EXISTS (
           SELECT FROM dead_letters d WHERE d.job_id = job.id AND d.state = 'open'
       )
$$;
DROP FUNCTION IF EXISTS jobs_purge_held(jobs);
DROP FUNCTION IF EXISTS jobs_purge_ended(jobs, float8);
"""


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0022_outbox_parked'),
    ]

    operations = [
        migrations.AddField(
            model_name='purgestate',
            name='kept',
            field=models.JSONField(default=dict),
        ),
        migrations.RunSQL(FORWARD, REVERSE),
    ]
