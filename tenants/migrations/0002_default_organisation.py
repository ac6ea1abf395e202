"""The organisation everything made before tenancy moves into: every existing user
becomes a member (superusers its admins), so their tokens and keys keep working."""

from django.db import migrations

DEFAULT_ORG_SLUG = "default"


def forwards(apps, schema_editor):
    Organisation = apps.get_model("tenants", "Organisation")
    Membership = apps.get_model("tenants", "Membership")
    User = apps.get_model("auth", "User")
    org, _ = Organisation.objects.get_or_create(
        slug=DEFAULT_ORG_SLUG, defaults={"name": "Default organisation"}
    )
    Membership.objects.bulk_create(
        [
            Membership(user_id=pk, organisation=org, role="admin" if su else "member")
            for pk, su in User.objects.values_list("pk", "is_superuser")
        ],
        ignore_conflicts=True,
    )


class Migration(migrations.Migration):
    dependencies = [("tenants", "0001_initial")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
