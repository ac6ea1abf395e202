from __future__ import annotations

from typing import Any, NoReturn

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models

from audit.errors import AuditImmutableError


class AppendOnlyQuerySet(models.QuerySet):
    # Bulk paths bypass Model.save()/delete(); refuse them here too. The database
    # triggers (migration 0002) are the real guard; this gives a clear error early.
    def update(self, **kwargs: Any) -> NoReturn:
        raise AuditImmutableError(f"{self.model.__name__} rows are append-only: update refused")

    def delete(self) -> NoReturn:
        raise AuditImmutableError(f"{self.model.__name__} rows are append-only: delete refused")

    def bulk_update(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise AuditImmutableError(f"{self.model.__name__} rows are append-only: update refused")


class AppendOnlyModel(models.Model):
    objects = AppendOnlyQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise AuditImmutableError(f"{type(self).__name__} {self.pk} is append-only")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise AuditImmutableError(f"{type(self).__name__} {self.pk} is append-only")


class ActorType(models.TextChoices):
    USER = "user"
    # An organisation's service account (docs/tenancy.md).
    SERVICE = "service"
    # Staff acting on other people's jobs or on the whole system from the portal.
    OPERATOR = "operator"
    SYSTEM = "system"
    API_KEY = "api_key"


class AuditLog(AppendOnlyModel):
    """One entry of a hash chain. `payload` holds the exact canonical JSON that was hashed."""

    chain = models.CharField(max_length=64)
    # Not a foreign key: audit rows outlive anything, and must never cascade.
    job_id = models.UUIDField(null=True, blank=True, db_index=True)
    seq = models.BigIntegerField()
    event_type = models.CharField(max_length=32)
    actor_type = models.CharField(max_length=16, choices=ActorType.choices)
    actor_id = models.CharField(max_length=64)
    ts = models.DateTimeField()
    payload = models.TextField()
    prev_hash = models.CharField(max_length=64)
    chain_hash = models.CharField(max_length=64)
    # The partition key (audit.partitions), set by the one writer (audit/sql/append.sql).
    # The table's primary key is (id, part); `id` alone stays the model's: ids come from
    # one sequence, so it is unique across partitions all the same.
    part = models.DateField()

    class Meta:
        db_table = "audit_logs"
        constraints = [
            # Together these make a fork impossible even if two appenders race. Checked
            # at commit: the statement trigger of audit/sql/append.sql refuses a row
            # that does not continue its chain first, naming it (migration 0007). With
            # `part` (a partitioned table's unique keys hold its partition key) they are
            # today's for a job chain, which lives in one partition; for the ops chain,
            # across months, the trigger and the chain lock are what keep it one chain
            # (docs/architecture.md#partitions).
            models.UniqueConstraint(
                fields=["chain", "seq", "part"],
                name="audit_chain_seq_part_uniq",
                deferrable=models.Deferrable.DEFERRED,
            ),
            models.UniqueConstraint(
                fields=["chain", "prev_hash", "part"],
                name="audit_chain_prev_part_uniq",
                deferrable=models.Deferrable.DEFERRED,
            ),
            models.CheckConstraint(condition=models.Q(seq__gte=1), name="audit_seq_positive"),
        ]
        indexes = [models.Index(fields=["ts"], name="audit_ts_idx")]

    def __str__(self) -> str:
        return f"{self.chain}#{self.seq} {self.event_type}"


class AuditCheckpoint(AppendOnlyModel):
    """Signed snapshot of chain heads; itself a chain (prev_hash -> checkpoint_hash)."""

    created_at = models.DateTimeField()
    # Highest audit_logs.id covered; the next checkpoint covers rows above it.
    last_audit_id = models.BigIntegerField()
    payload = models.TextField()  # canonical JSON: heads, last_audit_id, created_at, prev
    prev_hash = models.CharField(max_length=64, unique=True)
    checkpoint_hash = models.CharField(max_length=64)
    key_id = models.CharField(max_length=32)
    signature = models.CharField(max_length=64)
    # Ed25519 over the checkpoint hash, base64 (audit.signing); empty on checkpoints
    # written before it existed, which verify by their HMAC only.
    ed25519_signature = models.CharField(max_length=88, blank=True, default="")
    # Version 2 (audit.tree): the heads the payload commits to through heads_root, in byte
    # order of the chain name. Not hashed; every reader checks them against the root.
    # Null on version 1 checkpoints, whose payload holds them.
    heads = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "audit_checkpoints"
        indexes = [
            # The checkpoint naming a job's head (audit.proofs): a containment probe.
            GinIndex(
                fields=["heads"],
                name="audit_cp_heads_gin",
                opclasses=["jsonb_path_ops"],
                condition=models.Q(heads__isnull=False),
            )
        ]

    def __str__(self) -> str:
        return f"checkpoint {self.pk} @ {self.created_at:%Y-%m-%d %H:%M:%S}"


class AuditTreeHead(AppendOnlyModel):
    """A signed head of the checkpoint log (audit.tree): after the checkpoint
    `checkpoint_id`, leaf tree_size - 1, the log of tree_size checkpoints has root_hash.

    `nodes` holds the tree nodes this leaf completed (level 0, the leaf hash, first), from
    which every later root and proof is computed. No foreign key: audit rows never cascade.
    """

    tree_size = models.BigIntegerField(unique=True)
    checkpoint_id = models.BigIntegerField(unique=True)
    checkpoint_hash = models.CharField(max_length=64)
    root_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField()
    # Which Ed25519 key signed it (audit.tree.public_key_id), and its signature (base64)
    # over audit.tree.tree_head_bytes.
    key_id = models.CharField(max_length=32)
    signature = models.CharField(max_length=88)
    nodes = ArrayField(models.CharField(max_length=64))

    class Meta:
        db_table = "audit_tree_heads"
        constraints = [
            models.CheckConstraint(condition=models.Q(tree_size__gte=1), name="audit_tree_size_pos")
        ]

    def __str__(self) -> str:
        return f"tree head {self.tree_size} @ {self.created_at:%Y-%m-%d %H:%M:%S}"


class AuditPartitionArchive(AppendOnlyModel):
    """A signed archive of one audit_logs partition, written and verified offline
    (audit.partition_archive): what `audit_detach` requires before it drops the
    partition. Append-only like the other audit tables; no foreign key to anything, the
    partition it names goes away."""

    partition = models.CharField(max_length=63)  # the table's name, audit_logs_job_2026_08
    file_name = models.CharField(max_length=255)
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    rows = models.BigIntegerField()
    # The newest signed checkpoint the archive carries, which covers its last entries.
    checkpoint_hash = models.CharField(max_length=64)
    key_id = models.CharField(max_length=32)
    verified_at = models.DateTimeField()

    class Meta:
        db_table = "audit_partition_archives"
        indexes = [models.Index(fields=["partition"], name="audit_part_archive_idx")]

    def __str__(self) -> str:
        return f"{self.partition} archive {self.file_name} ({self.sha256[:12]})"
