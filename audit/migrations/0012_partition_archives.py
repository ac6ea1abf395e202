"""The record of partition archives (issue 42, point 2: docs/operations/audit-archives.md).

`audit_partition_archives` holds one row per archive `audit_archive --partition` wrote
and verified offline; `audit_detach` drops a partition only when a row names the sha256
of the file it is given. Append-only as the other audit tables (the triggers of 0002);
the app role may SELECT and INSERT it only (audit.db_roles, manage.py setup_db_roles).
"""

from django.db import migrations, models

TRIGGERS = """
CREATE TRIGGER audit_partition_archives_no_update_delete
    BEFORE UPDATE OR DELETE ON audit_partition_archives
    FOR EACH ROW EXECUTE FUNCTION jobops_refuse_audit_change();
CREATE TRIGGER audit_partition_archives_no_truncate BEFORE TRUNCATE ON audit_partition_archives
    FOR EACH STATEMENT EXECUTE FUNCTION jobops_refuse_audit_change();
"""

DROP_TRIGGERS = """
DROP TRIGGER IF EXISTS audit_partition_archives_no_update_delete ON audit_partition_archives;
DROP TRIGGER IF EXISTS audit_partition_archives_no_truncate ON audit_partition_archives;
"""


class Migration(migrations.Migration):
    dependencies = [("audit", "0010_partitioned_audit_log")]

    operations = [
        migrations.CreateModel(
            name="AuditPartitionArchive",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("partition", models.CharField(max_length=63)),
                ("file_name", models.CharField(max_length=255)),
                ("sha256", models.CharField(max_length=64)),
                ("size", models.BigIntegerField()),
                ("rows", models.BigIntegerField()),
                ("checkpoint_hash", models.CharField(max_length=64)),
                ("key_id", models.CharField(max_length=32)),
                ("verified_at", models.DateTimeField()),
            ],
            options={
                "db_table": "audit_partition_archives",
                "indexes": [models.Index(fields=["partition"], name="audit_part_archive_idx")],
            },
        ),
        migrations.RunSQL(TRIGGERS, DROP_TRIGGERS),
    ]
