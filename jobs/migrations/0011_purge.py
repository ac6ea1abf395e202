# Retention and purge (docs/operations/retention.md): the purge step's record of its
# last run (purge_state, one row); the index that finds a purged job's published outbox
# rows, built CONCURRENTLY (on a large outbox a plain CREATE INDEX would block every
# transition, each of which writes an event, for as long as it takes); and
# `jobs_purge_due(job, keep)`, whether an ended job may go once `keep` seconds have
# passed since it ended: the one rule both purge statements apply (jobs/queries.sql).

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


FUNCTION = """
CREATE OR REPLACE FUNCTION jobs_purge_due(job jobs, keep float8) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT job.status IN ('succeeded', 'failed', 'cancelled')
       AND job.updated_at < now() - make_interval(secs => keep)
       AND (job.idempotency_expires_at IS NULL OR job.idempotency_expires_at <= now())
       AND NOT EXISTS (
           SELECT FROM dead_letters d WHERE d.job_id = job.id AND d.state = 'open'
       )
$$;
"""
REVERSE = "DROP FUNCTION IF EXISTS jobs_purge_due(jobs, float8);"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('jobs', '0010_statement_functions'),
    ]

    operations = [
        migrations.CreateModel(
            name='PurgeState',
            fields=[
                ('id', models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False)),
                ('checked_at', models.DateTimeField(blank=True, null=True)),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('removed', models.JSONField(default=dict)),
            ],
            options={
                'db_table': 'purge_state',
                'constraints': [
                    models.CheckConstraint(condition=models.Q(('id', 1)), name='purge_state_one_row'),
                ],
            },
        ),
        AddIndexConcurrently(
            model_name='eventoutbox',
            index=models.Index(fields=['job_id'], name='outbox_job_idx'),
        ),
        migrations.RunSQL(FUNCTION, REVERSE),
    ]
