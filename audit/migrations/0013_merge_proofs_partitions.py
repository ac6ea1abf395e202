"""Joins the branches of issue 42: the partitioned log (0010), the checkpoint proofs
(0011) and the partition archives (0012) were written side by side; none depends on
another's tables, so their order does not matter."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0010_partitioned_audit_log"),
        ("audit", "0011_checkpoint_proofs"),
        ("audit", "0012_partition_archives"),
    ]

    operations: list[migrations.operations.base.Operation] = []
