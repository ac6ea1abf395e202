"""A proof per job (docs/architecture.md#the-checkpoint-log).

Checkpoints gain `heads` (version 2 keeps them outside the hashed payload, which commits
to their Merkle root); the new append-only table `audit_tree_heads` holds a signed head
of the checkpoint log after every checkpoint. Adding a nullable column rewrites no row,
so the append-only triggers see nothing; the partial GIN index is empty at first (every
existing checkpoint is version 1, heads null) and is built on a table of small rows.

Jobs whose chain was last checkpointed before this release get a proof once
`manage.py audit_checkpoint --all-heads` has run (docs/operations/upgrading.md): a
command, not a data migration, because it signs with the deployment's keys and must run
with the release's code, not a frozen copy.
"""

import django.contrib.postgres.fields
import django.contrib.postgres.indexes
from django.db import migrations, models

TABLE = "audit_tree_heads"

TRIGGERS = f"""
CREATE TRIGGER {TABLE}_no_update_delete BEFORE UPDATE OR DELETE ON {TABLE}
    FOR EACH ROW EXECUTE FUNCTION jobops_refuse_audit_change();
CREATE TRIGGER {TABLE}_no_truncate BEFORE TRUNCATE ON {TABLE}
    FOR EACH STATEMENT EXECUTE FUNCTION jobops_refuse_audit_change();
"""

DROP_TRIGGERS = f"""
DROP TRIGGER IF EXISTS {TABLE}_no_update_delete ON {TABLE};
DROP TRIGGER IF EXISTS {TABLE}_no_truncate ON {TABLE};
"""


class Migration(migrations.Migration):
    dependencies = [("audit", "0009_annotated")]

    operations = [
        migrations.CreateModel(
            name="AuditTreeHead",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("tree_size", models.BigIntegerField(unique=True)),
                ("checkpoint_id", models.BigIntegerField(unique=True)),
                ("checkpoint_hash", models.CharField(max_length=64)),
                ("root_hash", models.CharField(max_length=64)),
                ("created_at", models.DateTimeField()),
                ("key_id", models.CharField(max_length=32)),
                ("signature", models.CharField(max_length=88)),
                (
                    "nodes",
                    django.contrib.postgres.fields.ArrayField(
                        base_field=models.CharField(max_length=64), size=None
                    ),
                ),
            ],
            options={"db_table": TABLE},
        ),
        migrations.AddConstraint(
            model_name="audittreehead",
            constraint=models.CheckConstraint(
                condition=models.Q(("tree_size__gte", 1)), name="audit_tree_size_pos"
            ),
        ),
        migrations.RunSQL(TRIGGERS, DROP_TRIGGERS),
        migrations.AddField(
            model_name="auditcheckpoint",
            name="heads",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="auditcheckpoint",
            index=django.contrib.postgres.indexes.GinIndex(
                condition=models.Q(("heads__isnull", False)),
                fields=["heads"],
                name="audit_cp_heads_gin",
                opclasses=["jsonb_path_ops"],
            ),
        ),
    ]
