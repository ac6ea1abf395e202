"""The portal's roles (0006_roles) get the operator controls of issue 29: `operator`
may pause and resume a queue (`jobs.pause_queue`,
docs/operator-controls.md#pausing-a-queue) and manage recurring schedules
(docs/operator-controls.md#recurring-schedules); `viewer` sees pauses and schedules."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

GRANTS = {
    "operator": [
        "pause_queue",
        "view_queuepause",
        "add_schedule",
        "change_schedule",
        "delete_schedule",
        "view_schedule",
    ],
    "viewer": ["view_queuepause", "view_schedule"],
}


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
        content_type__app_label="jobs", codename__in=GRANTS["operator"]
    )
    for group in Group.objects.filter(name__in=GRANTS):
        group.permissions.remove(*perms)


class Migration(migrations.Migration):
    dependencies = [
        ("dlq", "0007_bulk_cancel"),
        ("jobs", "0018_params_search_indexes"),
    ]

    operations = [migrations.RunPython(grant, revoke)]
