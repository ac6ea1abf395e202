"""The portal's roles (0006_roles) get the breaker controls of issue 30: `operator` may
open and close a connector's breaker (`jobs.control_connector`, docs/connectors.md);
`viewer` sees the breakers."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

GRANTS = {
    "operator": ["control_connector", "view_connectorbreaker"],
    "viewer": ["view_connectorbreaker"],
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
        ("dlq", "0008_queue_schedule_roles"),
        ("jobs", "0019_connectors"),
    ]

    operations = [migrations.RunPython(grant, revoke)]
