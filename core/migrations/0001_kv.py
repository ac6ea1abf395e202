"""The key-value store's table (core/kv.py), UNLOGGED: its entries may be lost (rate-limit
buckets, heartbeats, cached depths, OTP grants, the dashboard snapshot), so writing them
to the WAL and to standbys would cost every request for nothing."""

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="KvEntry",
            fields=[
                ("key", models.TextField(db_collation="C", primary_key=True, serialize=False)),
                ("value", models.TextField(null=True)),
                ("expires_at", models.DateTimeField(null=True)),
            ],
            options={"db_table": "jobops_kv"},
        ),
        migrations.RunSQL(
            "ALTER TABLE jobops_kv SET UNLOGGED", reverse_sql="ALTER TABLE jobops_kv SET LOGGED"
        ),
    ]
