"""The portal's roles (docs/security.md) as groups: `viewer` reads everything in the portal,
`operator` also cancels jobs and replays and discards dead letters. Users and OTP
devices stay with superusers (no group grants them).

On a fresh database the permissions do not exist yet while migrations run (Django
creates them in post_migrate), so this migration creates them first.
"""

from django.contrib.auth.management import create_permissions
from django.db import migrations

# (app_label, codename): reading the portal's pages.
VIEWER = [
    ("jobs", "view_job"),
    ("jobs", "view_artefact"),
    ("jobs", "view_deadletter"),
    ("audit", "view_auditlog"),
    ("audit", "view_auditcheckpoint"),
    ("dlq", "view_bulkoperation"),
    ("django_celery_results", "view_taskresult"),
    ("django_celery_results", "view_groupresult"),
]
OPERATOR = [
    *VIEWER,
    ("jobs", "cancel_job"),
    ("jobs", "replay_deadletter"),
    ("jobs", "discard_deadletter"),
]
ROLES = {"viewer": VIEWER, "operator": OPERATOR}


def create_roles(apps, schema_editor):
    for app_config in apps.get_app_configs():
        # Historical app configs have no models module; create_permissions skips
        # those, so mark them for the call.
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for name, wanted in ROLES.items():
        group, _ = Group.objects.get_or_create(name=name)
        perms = [
            Permission.objects.get(content_type__app_label=app, codename=codename)
            for app, codename in wanted
        ]
        group.permissions.set(perms)


def drop_roles(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=ROLES).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("audit", "0003_insert_at_head"),
        ("jobs", "0004_deadletter"),
        ("django_celery_results", "0014_alter_taskresult_status"),
        ("dlq", "0005_bulk_operations"),
    ]

    operations = [migrations.RunPython(create_roles, drop_roles)]
