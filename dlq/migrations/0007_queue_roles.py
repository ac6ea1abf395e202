"""The portal's roles (0006_roles) get the queue controls of issue 29
(docs/operator-controls.md#pausing-a-queue): `operator` may pause and resume a queue
(`jobs.pause_queue`) and sees the pauses, `viewer` sees them (`jobs.view_queuepause`)."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

GRANTS = {"operator": ["pause_queue", "view_queuepause"], "viewer": ["view_queuepause"]}


def grant(apps, schema_editor):
    # The permissions do not exist yet while migrations run (Django creates them in
    # post_migrate): create them first, as 0006_roles did.
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
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    perms = Permission.objects.filter(
        content_type__app_label="jobs", codename__in=["pause_queue", "view_queuepause"]
    )
    for group in Group.objects.filter(name__in=GRANTS):
        group.permissions.remove(*perms)


class Migration(migrations.Migration):
    dependencies = [
        ("dlq", "0006_roles"),
        ("jobs", "0015_queue_pause_priority"),
    ]

    operations = [migrations.RunPython(grant, revoke)]
