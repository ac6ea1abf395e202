"""Every job in an organisation (docs/tenancy.md): the jobs made before tenancy move
into the default one; an idempotency key is unique per (organisation, owner, key), so
every existing key stays valid."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0012_job_category_key_last_seen'),
        ('tenants', '0002_default_organisation'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='job',
            name='jobs_owner_idempotency_uniq',
        ),
        migrations.AddField(
            model_name='job',
            name='org',
            field=models.ForeignKey(db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='jobs', to='tenants.organisation'),
        ),
        migrations.RunSQL(
            "UPDATE jobs SET org_id = (SELECT id FROM organisations WHERE slug = 'default') "
            "WHERE org_id IS NULL",
            migrations.RunSQL.noop,
        ),
        migrations.AlterField(
            model_name='job',
            name='org',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='jobs', to='tenants.organisation'),
        ),
        migrations.AddField(
            model_name='job',
            name='project',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='jobs', to='tenants.project'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(fields=['org', '-created_at'], name='jobs_org_created_idx'),
        ),
        migrations.AddConstraint(
            model_name='job',
            constraint=models.UniqueConstraint(fields=('org', 'owner', 'idempotency_key'), name='jobs_org_owner_idempotency_uniq'),
        ),
    ]
