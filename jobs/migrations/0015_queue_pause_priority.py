"""Operator controls (issue 29, docs/operator-controls.md): queue pauses and job priority.

- `queue_pauses`: one row per paused queue; the `operator` role may pause and resume
  (`jobs.pause_queue`), the `viewer` role sees the pauses (`jobs.view_queuepause`).
- `jobs.priority` 0-9 (default 5 in the database too, so rows inserted by an older
  release during a rolling deploy get it), with jobs_pending_priority_idx: a queue's
  pending jobs in the order they enter its broker window.
"""

import django.db.models.deletion
from django.conf import settings
from django.contrib.auth.management import create_permissions
from django.db import migrations, models

GRANTS = {"operator": ["pause_queue", "view_queuepause"], "viewer": ["view_queuepause"]}


def grant(apps, schema_editor):
    # The permissions do not exist yet while migrations run (Django creates them in
    # post_migrate): create them first, as dlq/migrations/0006_roles did.
    app_config = apps.get_app_config("jobs")
    app_config.models_module = True
    create_permissions(app_config, apps=apps, verbosity=0)
    app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for name, codenames in GRANTS.items():
        group = Group.objects.filter(name=name).first()
        if group is not None:
            group.permissions.add(
                *Permission.objects.filter(content_type__app_label="jobs", codename__in=codenames)
            )


def revoke(apps, schema_editor):
    Permission = apps.get_model("auth", "Permission")
    Permission.objects.filter(
        content_type__app_label="jobs", codename__in=["pause_queue", "view_queuepause"]
    ).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0014_audit_context"),
        ("tenants", "0002_default_organisation"),
        ("dlq", "0006_roles"),
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
        migrations.RunPython(grant, revoke),
    ]
