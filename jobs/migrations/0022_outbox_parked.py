# The ERP events a receiver refused for good, parked in the outbox when jobops runs
# without a broker (docs/smallest-deployment.md): three nullable columns (no default,
# so adding them rewrites nothing), and the claim's partial index exchanged for one that
# leaves parked rows out. Built CONCURRENTLY, the new index before the old one goes, so
# that the relay's claim always has one and no transition waits for a build.

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('jobs', '0021_postgres_executor'),
    ]

    operations = [
        migrations.AddField(
            model_name='eventoutbox',
            name='parked_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='eventoutbox',
            name='park_status',
            field=models.PositiveSmallIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='eventoutbox',
            name='park_text',
            field=models.TextField(blank=True, null=True),
        ),
        AddIndexConcurrently(
            model_name='eventoutbox',
            index=models.Index(condition=models.Q(('parked_at__isnull', True), ('published_at__isnull', True)), fields=['id'], name='outbox_waiting_idx'),
        ),
        AddIndexConcurrently(
            model_name='eventoutbox',
            index=models.Index(condition=models.Q(('parked_at__isnull', False), ('published_at__isnull', True)), fields=['id'], name='outbox_parked_idx'),
        ),
        RemoveIndexConcurrently(
            model_name='eventoutbox',
            name='outbox_unpublished_idx',
        ),
    ]
