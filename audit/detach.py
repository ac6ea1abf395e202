"""Detach and drop an archived audit_logs partition (docs/operations/audit-archives.md).

The one way audit rows leave the database: a whole partition, once a signed archive of it
was written and verified offline (audit.partition_archive), removed by the database
owner role, and the removal audited on the ops chain (`audit_partition_detached`, naming
the archive's sha256 and the checkpoint that covers its last entries).

`detach_partition` checks, then in one transaction, within lock_timeout:

1. appends `audit_partition_detached` to the ops chain (first: it lands in the current
   month's ops partition, so the chain's head stays in the database whichever segment
   goes; an append finds its head in the partitions that are left);
2. `ALTER TABLE audit_logs DETACH PARTITION`: ACCESS EXCLUSIVE on audit_logs, so appends
   wait for the rest of this transaction (milliseconds: catalogue changes and an unlink,
   docs/operations/audit-archives.md#detach gives the figures); it waits itself for every
   transaction that has read or written audit_logs, hence the timeout: a long
   verification holding audit_logs would otherwise queue every append behind it;
3. `DROP TABLE` of the partition.

The app role can do none of it (it owns no partition); this module refuses it first,
naming the role. The dispatcher never calls it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import time
from dataclasses import dataclass
from typing import IO, Any, cast

import structlog
from django.db import connection, transaction
from psycopg import sql

from audit.archive import ArchiveUnreadable, verify_archive
from audit.canonical import GENESIS_HASH
from audit.models import AuditPartitionArchive
from audit.partition_archive import PQ, PartitionError, PartitionRef, attached, refuse_open
from audit.partitions import list_partitions
from audit.queries import QUERIES
from audit.services import OPS_CHAIN, Actor, audit_append
from audit.signing import public_key_text

log = structlog.get_logger("audit.detach")

DETACHED = "audit_partition_detached"
DETACHER = Actor.system("audit_detach")
# How long the detach waits for the transactions that use audit_logs before it gives up
# (and holds no append meanwhile longer than that).
LOCK_TIMEOUT = "5s"


@dataclass(frozen=True)
class Detached:
    """One `audit_partition_detached` entry's data (what the ops chain says went)."""

    partition: str
    kind: str
    part: str
    file_name: str
    sha256: str
    checkpoint_hash: str
    key_id: str
    rows: int
    # Each chain that goes on past the partition (the ops chain): its last entry there,
    # or, for a segment that had none, the one before (the chain's live start follows it).
    segments: tuple[tuple[str, int, str], ...]

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Detached:
        return cls(
            partition=str(data["partition"]),
            kind=str(data.get("kind", "")),
            part=str(data.get("part", "")),
            file_name=str(data["file_name"]),
            sha256=str(data["sha256"]),
            checkpoint_hash=str(data["checkpoint_hash"]),
            key_id=str(data.get("key_id", "")),
            rows=int(data.get("rows", 0)),
            segments=tuple(
                (str(s["chain"]), int(s["seq"]), str(s["hash"])) for s in data.get("segments", [])
            ),
        )


def detached_partitions() -> list[Detached]:
    """Every partition the ops chain says was detached, in the order it went (the live
    ops chain's entries; the entries of ops partitions detached since are in their
    archives: audit.history reads those)."""
    with connection.cursor() as cursor:
        cursor.execute(PQ["detached_entries"], {"ops": OPS_CHAIN})
        rows = cursor.fetchall()
    return [Detached.from_data(json.loads(payload)["data"]) for _seq, payload in rows]


def file_sha256(path: str) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as raw:
        for block in iter(lambda: raw.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size


def _refuse_non_owner(ref: PartitionRef) -> None:
    with connection.cursor() as cursor:
        cursor.execute(PQ["partition_owner"], {"name": ref.name})
        row = cursor.fetchone()
    if row is None:
        raise PartitionError(f"{ref.label}: no table {ref.name}")
    may, user, owner = row
    if not may:
        raise PartitionError(
            f"audit_detach refused: the database role {user!r} does not own {ref.name} (its "
            f"owner is {owner!r}); run it with the owner role's DATABASE_URL, never the app's"
        )


def _refuse_out_of_order(ref: PartitionRef) -> None:
    """The ops chain leaves the database oldest segment first: its live start must
    follow the last segment detached."""
    if not ref.holds_segments:
        return
    older = [
        p.name
        for p in list_partitions()
        if p.name != ref.name
        and (
            p.kind == "legacy"
            or (
                p.kind == "ops"
                and ref.kind == "ops"
                and p.month is not None
                and p.month < ref.part.replace(day=1)
            )
        )
    ]
    if older:
        raise PartitionError(
            f"{ref.label}: the ops chain's older segments are still attached "
            f"({', '.join(sorted(older))}): detach them first, oldest first"
        )


def _verified_record(ref: PartitionRef, path: str) -> tuple[AuditPartitionArchive, dict[str, Any]]:
    """The archive record of `ref` whose sha256 is the file's, after the file verified
    offline again; its header."""
    digest, _size = file_sha256(path)
    record = (
        AuditPartitionArchive.objects.filter(partition=ref.name, sha256=digest)
        .order_by("-id")
        .first()
    )
    if record is None:
        raise PartitionError(
            f"{ref.label}: no verified archive of {ref.name} has the sha256 of {path} ({digest}); "
            f"write one with `manage.py audit_archive --partition {ref.label}`"
        )
    try:
        with gzip.open(path, "rb") as file:
            header = json.loads(file.readline())
        with gzip.open(path, "rb") as file:
            report = verify_archive(cast(IO[bytes], file), public_key=public_key_text())
    except (ArchiveUnreadable, OSError, ValueError) as exc:
        raise PartitionError(f"{path}: {exc}") from exc
    if not report.ok:
        raise PartitionError(
            f"{path} does not verify offline: " + "; ".join(str(p) for p in report.problems[:5])
        )
    if header.get("partition", {}).get("name") != ref.name:
        raise PartitionError(f"{path} is the archive of another partition")
    return record, header


def _segments(ref: PartitionRef, header: dict[str, Any]) -> list[dict[str, Any]]:
    """Where each chain that goes on past the partition stands at its end."""
    found = {s["chain"]: s for s in header.get("segments", [])}
    if ref.holds_segments and OPS_CHAIN not in found:  # an ops month without an entry
        previous = [s for d in detached_partitions() for s in d.segments if s[0] == OPS_CHAIN]
        if previous:
            chain, seq, digest = previous[-1]
            found[chain] = {"chain": chain, "last_seq": seq, "last_hash": digest}
    return [
        {"chain": s["chain"], "seq": s["last_seq"], "hash": s["last_hash"]}
        for s in sorted(found.values(), key=lambda s: s["chain"])
    ]


def detach_partition(ref: PartitionRef, path: str) -> dict[str, Any]:
    """Detach and drop the partition `ref` whose verified archive is the file `path`;
    returns the data of its `audit_partition_detached` entry and the seconds the
    exclusive part held audit_logs. PartitionError says why it was refused."""
    if not os.path.isfile(path):
        raise PartitionError(f"--archive {path}: no such file")
    if not attached(ref):
        raise PartitionError(f"{ref.label}: no partition {ref.name} is attached to audit_logs")
    _refuse_non_owner(ref)
    refuse_open(ref, "detaching")
    _refuse_out_of_order(ref)
    record, header = _verified_record(ref, path)
    with connection.cursor() as cursor:
        cursor.execute(PQ["partition_rows"], {"part": ref.part})
        rows = cursor.fetchone()[0]
    if rows != record.rows:
        raise PartitionError(
            f"{ref.name} holds {rows} rows, its archive {record.rows}: archive it again"
        )
    data = {
        "partition": ref.name,
        "kind": ref.kind,
        "part": ref.part.isoformat(),
        "file_name": record.file_name,
        "sha256": record.sha256,
        "size": record.size,
        "rows": rows,
        "checkpoint_hash": record.checkpoint_hash,
        "key_id": record.key_id,
        "segments": _segments(ref, header),
    }
    table = sql.Identifier(ref.name)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(QUERIES["lock_timeout_set"], {"timeout": LOCK_TIMEOUT})
        # The entry first: it lands in the current month's ops partition, so the ops
        # chain's head stays in the database whichever segment goes (an append finds
        # its head in the partitions that are left: audit.services.audit_append).
        audit_append(chain=OPS_CHAIN, event_type=DETACHED, actor=DETACHER, data=data)
        started = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute(sql.SQL("ALTER TABLE audit_logs DETACH PARTITION {}").format(table))
            cursor.execute(sql.SQL("DROP TABLE {}").format(table))
        held = time.perf_counter() - started
    log.info("audit_partition_detached", **data, held_seconds=round(held, 4))
    return {**data, "held_seconds": held}


def genesis_or(segments: tuple[tuple[str, int, str], ...], chain: str) -> tuple[int, str]:
    """Where `chain` starts in the live database given the segments detached: after
    the last one's entry, or at seq 1 from the genesis hash."""
    for name, seq, digest in reversed(segments):
        if name == chain:
            return seq + 1, digest
    return 1, GENESIS_HASH
