"""jobs.audit_part: the partition of a job's audit chain (audit.partitions).

Added with the constant default 1970-01-01 (metadata only: no rewrite of the jobs
table), so every job that exists before the partitioned audit log, or is created before
its cut-over (audit/migrations/0010), keeps its chain in the legacy partition, however
long it lives. The cut-over makes the default the current UTC month, which only a
writer that names no part (the previous release's job create, during a rolling
upgrade) falls back on; today's creates set it from created_at (jobs/queries.sql).
"""

from django.db import migrations, models

import audit.partitions

ADD = ["ALTER TABLE jobs ADD COLUMN IF NOT EXISTS audit_part date NOT NULL DEFAULT '1970-01-01'"]
DROP = ["ALTER TABLE jobs DROP COLUMN IF EXISTS audit_part"]


class Migration(migrations.Migration):
    dependencies = [("jobs", "0028_webhooks")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(ADD, DROP)],
            state_operations=[
                migrations.AddField(
                    model_name="job",
                    name="audit_part",
                    field=models.DateField(
                        default=audit.partitions.current_job_part, editable=False
                    ),
                ),
            ],
        )
    ]
