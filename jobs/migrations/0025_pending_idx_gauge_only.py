# jobs_pending_idx serves the oldest-pending gauge alone: its predicate gains
# `priority >= 0`, which only the gauge's statement tests. Before, on a large table
# whose statistics show almost no pending job, the claims (claimable_jobs) and the
# publisher (due_pending_jobs) took it as a "one-row" index, read every pending job of
# the queue and sorted them, instead of the ordered probe of jobs_pending_priority_idx
# that stops at their LIMIT (docs/benchmarks.md#beside-a-million-finished-jobs).
# Dropped and built again CONCURRENTLY: jobs are created and change state meanwhile.

from django.contrib.postgres.operations import (
    AddIndexConcurrently,
    RemoveIndexConcurrently,
)
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("jobs", "0024_jobs_ended_idx"),
    ]

    operations = [
        RemoveIndexConcurrently(model_name="job", name="jobs_pending_idx"),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("priority__gte", 0), ("status", "pending")),
                fields=["created_at"],
                name="jobs_pending_idx",
            ),
        ),
    ]
