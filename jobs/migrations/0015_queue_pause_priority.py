"""Operator controls (issue 29, docs/operator-controls.md): queue pauses and job priority.

- `queue_pauses`: one row per paused queue; `jobs.pause_queue` lets an operator pause
  and resume (granted to the roles by dlq/migrations/0007_queue_roles, which sits with
  the roles' own migration: this one depends on no other app's latest migration, so
  that migrating audit or dlq back and forth never takes it along).
- `jobs.priority` 0-9 (default 5 in the database too, so rows inserted by an older
  release during a rolling deploy get it), with jobs_pending_priority_idx: a queue's
  pending jobs in the order they enter its broker window.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0014_audit_context"),
        ("tenants", "0002_default_organisation"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="QueuePause",
            fields=[
                ("queue", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("paused_at", models.DateTimeField()),
                ("reason", models.TextField()),
            ],
            options={
                "db_table": "queue_pauses",
                "permissions": [("pause_queue", "Can pause and resume a queue")],
            },
        ),
        migrations.AddField(
            model_name="job",
            name="priority",
            field=models.PositiveSmallIntegerField(db_default=5, default=5),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("queue"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("created_at"),
                condition=models.Q(("status", "pending")),
                name="jobs_pending_priority_idx",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(("priority__gte", 0), ("priority__lte", 9)),
                name="jobs_priority_range",
            ),
        ),
        migrations.AddField(
            model_name="queuepause",
            name="paused_by",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
    ]
