# The purge's index (docs/operations/retention.md#how-it-runs): each type's ended jobs by
# when they ended. Before it, every purge batch and the look for kept jobs walked
# jobs_created_idx over every job older than the shortest retention, the rule called
# per row: beside 1,000,000 finished jobs of a type kept 90 days, seconds of database
# CPU per pass with nothing due (docs/benchmarks.md#beside-a-million-finished-jobs).
# Built CONCURRENTLY: on a large jobs table a plain CREATE INDEX would block job
# creation and every transition for as long as it takes.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("jobs", "0023_purge_foreign_keys"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status__in", ["succeeded", "failed", "cancelled"])),
                fields=["type", "updated_at"],
                name="jobs_ended_idx",
            ),
        ),
    ]
