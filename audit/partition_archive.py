"""The archive of one audit_logs partition
(docs/operations/audit-archives.md#partitions-archive-then-detach).

`manage.py audit_archive --partition NAME` writes, in the format of audit.archive (a
gzip file of canonical JSON lines, a signed header, verified offline with the public key
alone), exactly the rows of one partition:

- a job partition (`YYYY-MM`, `audit_logs_job_YYYY_MM`) or the legacy one (`legacy`)
  holds whole job chains, each from seq 1: every one must be closed (its last entry
  `purged`) and named at that head by a checkpoint;
- the ops chain (any chain that is not a job's) is cut into monthly segments (`ops-YYYY-MM`;
  its first segment is in the legacy partition): the header's chain starts at the
  segment's first seq with the hash before it (`from_seq`, `from_hash`), and ends at the
  first head at or after the segment's last entry that a checkpoint names, so that the
  segment's end is signed; entries past the segment (in the next month) are then in two
  archives. `segments` in the header names each segment's own last entry, which the next
  segment (or the live ops chain) must continue.

The header also names its partition, its row count and the key id, and carries the
newest checkpoint signed under the current key when it was written (the checkpoint
that covers its last entries, which the record and the detach name).

Only once the file verifies offline (`verify_archive`, the public key) is it recorded in
`audit_partition_archives`; `audit_detach` requires that record.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import IO, Any, cast

import structlog
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from prometheus_client import Gauge

from audit.archive import (
    FORMAT,
    VERSION,
    ArchiveError,
    _checkpoints,
    _cutoff,
    entry_line,
    verify_archive,
)
from audit.canonical import canonical_bytes
from audit.models import AuditPartitionArchive
from audit.partitions import LEGACY_PART, LEGACY_PARTITION, list_partitions, partition_name
from audit.queries import QUERIES
from audit.services import format_ts
from audit.signing import public_key_text, sign
from core.queries import load

PQ = load(Path(__file__).with_name("partition_queries.sql"))
log = structlog.get_logger("audit.partition_archive")

# Here rather than in jobs.integrations.metrics: the audit app imports nothing of jobs.
AUDIT_PARTITIONS_READY_TO_DETACH = Gauge(
    "audit_partitions_ready_to_detach",
    "audit_logs partitions whose job chains are all closed, whose month is over and whose "
    "archive was written and verified: each waits for `manage.py audit_detach` by the owner "
    "role (the dispatcher's audit_archives step, hourly)",
    multiprocess_mode="mostrecent",
)

BATCH_ROWS = 2_000
# Open chains an error names (the count covers all of them).
OPEN_NAMED = 5


@dataclass(frozen=True)
class PartitionRef:
    """One partition of audit_logs: its table name, kind and part."""

    name: str  # audit_logs_job_2026_08
    kind: str  # "job", "ops" or "legacy"
    part: date

    @property
    def label(self) -> str:
        """The name the commands take: 2026-08, ops-2026-08 or legacy."""
        if self.kind == "legacy":
            return "legacy"
        month = f"{self.part:%Y-%m}"
        return month if self.kind == "job" else f"ops-{month}"

    @property
    def holds_segments(self) -> bool:
        """Whether chains that go on past it (the ops chain) have entries in it."""
        return self.kind in ("ops", "legacy")

    def month_ended(self, today: date) -> bool:
        if self.kind == "legacy":
            return True
        return (self.part.year, self.part.month) < (today.year, today.month)


class PartitionError(ArchiveError):
    """A partition cannot be archived or detached (the message says why): exit 1, or
    `returncode` 2 for a name that is no partition."""


def resolve(text: str) -> PartitionRef:
    """A partition from its command-line name: `YYYY-MM` (that month's job partition),
    `ops-YYYY-MM` (the ops one), `legacy`, or the table's own name."""
    value = text.strip()
    if value in ("legacy", LEGACY_PARTITION):
        return PartitionRef(LEGACY_PARTITION, "legacy", LEGACY_PART)
    kind, month = "job", value
    if value.startswith("audit_logs_job_") or value.startswith("audit_logs_ops_"):
        kind, month = value[11:14], value[15:].replace("_", "-")
    elif value.startswith("ops-"):
        kind, month = "ops", value[4:]
    try:
        year, number = (int(x) for x in month.split("-"))
        first = date(year, number, 1)
    except ValueError:
        raise PartitionError(
            f"{text!r} names no partition: YYYY-MM (a month's job partition), ops-YYYY-MM "
            "(its ops partition) or legacy",
            returncode=2,
        ) from None
    part = first if kind == "job" else first.replace(day=2)
    return PartitionRef(partition_name(part), kind, part)


def attached(ref: PartitionRef) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(PQ["partition_attached"], {"name": ref.name})
        return bool(cursor.fetchone()[0])


def open_chains(ref: PartitionRef) -> tuple[int, list[str]]:
    """How many job chains of the partition are not closed by `purged`, and the first."""
    with connection.cursor() as cursor:
        cursor.execute(PQ["partition_open_chains"], {"part": ref.part, "limit": OPEN_NAMED})
        rows = cursor.fetchall()
    return (rows[0][0] if rows else 0), [r[1] for r in rows]


def refuse_open(ref: PartitionRef, what: str) -> None:
    count, named = open_chains(ref)
    if count:
        more = f" and {count - len(named)} more" if count > len(named) else ""
        raise PartitionError(
            f"{what} {ref.label} ({ref.name}) refused: {count} job chain(s) in it are still "
            f"open (their last entry is not `purged`): {', '.join(named)}{more}. A job goes "
            "with its retention (docs/operations/retention.md#stragglers)"
        )


def archive_partition(ref: PartitionRef, path: str) -> dict[str, Any]:
    """Write the archive of the partition `ref` to `path`, verify it offline with the
    public key, and record it; return the header. Refused (PartitionError) while a job
    chain of it is open, its month has not ended, or no checkpoint covers its last
    entries. The file is removed again when it does not verify."""
    if not attached(ref):
        raise PartitionError(f"{ref.label}: no partition {ref.name} is attached to audit_logs")
    if not ref.month_ended(timezone.now().date()):
        raise PartitionError(
            f"{ref.label} ({ref.name}) is the current or a future month's: entries may still "
            "be written to it"
        )
    refuse_open(ref, "archiving")
    header = _write(ref, path)
    with open(path, "rb") as raw:
        digest, size = hashlib.sha256(), 0
        for block in iter(lambda: raw.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    with gzip.open(path, "rb") as file:
        report = verify_archive(cast(IO[bytes], file), public_key=public_key_text())
    if not report.ok:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise PartitionError(
            f"the archive of {ref.label} does not verify offline, so it was removed: "
            + "; ".join(str(p) for p in report.problems[:5])
        )
    AuditPartitionArchive.objects.create(
        partition=ref.name,
        file_name=os.path.basename(path),
        sha256=digest.hexdigest(),
        size=size,
        rows=header["partition"]["rows"],
        checkpoint_hash=header["checkpoint_hash"],
        key_id=header["key_id"],
        verified_at=timezone.now(),
    )
    log.info("audit_partition_archived", partition=ref.name, path=path, sha256=digest.hexdigest())
    return header


def _write(ref: PartitionRef, path: str) -> dict[str, Any]:
    """The archive, from one REPEATABLE READ READ ONLY snapshot, written beside `path`
    and renamed into place."""
    with transaction.atomic():
        if len(connection.atomic_blocks) == 1:
            with connection.cursor() as cursor:
                cursor.execute(QUERIES["read_only_snapshot"])
        upto = _cutoff(timezone.now())
        with connection.cursor() as cursor:
            cursor.execute(PQ["partition_last_entries"], {"part": ref.part})
            found = cursor.fetchall()
        rows = sum(r[6] for r in found)
        chains = [
            {
                "chain": c,
                "low": lo,
                "prev": prev,
                "last": hi,
                "hash": h,
                "segment": not c.startswith("job:"),
            }
            for c, lo, prev, hi, h, _event, _n in found
        ]
        covered = _covering(chains, upto, ref)
        missing = [c["chain"] for c in chains if c["chain"] not in covered]
        if missing:
            raise PartitionError(
                f"{len(missing)} chain(s) of {ref.label} have no signed checkpoint naming their "
                f"last entry yet (e.g. {missing[0]}): run `manage.py audit_checkpoint`, then "
                "archive again"
            )
        header: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "created_at": format_ts(timezone.now()),
            "partition": {
                "name": ref.name,
                "label": ref.label,
                "kind": ref.kind,
                "part": ref.part.isoformat(),
                "rows": rows,
            },
            "public_key": public_key_text(),
            # The keyring's name of that key (AUDIT_SIGNING_KEY_ID).
            "key_id": settings.AUDIT_SIGNING_KEY_ID,
            "checkpoints": _checkpoints({upto, *(covered[c][2] for c in covered)}),
            "chains": [_chain_entry(c, covered[c["chain"]]) for c in chains],
            "segments": [
                {"chain": c["chain"], "last_seq": c["last"], "last_hash": c["hash"]}
                for c in chains
                if c["segment"]
            ],
        }
        header["checkpoint_hash"] = next(
            cp["checkpoint_hash"] for cp in header["checkpoints"] if cp["id"] == upto
        )
        header["signature"] = sign(canonical_bytes(header))
        partial = f"{path}.partial"
        try:
            with open(partial, "wb") as raw, gzip.GzipFile("", "wb", fileobj=raw, mtime=0) as file:
                file.write(canonical_bytes(header) + b"\n")
                for line in _entry_lines(header["chains"]):
                    file.write(line + b"\n")
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise
    os.replace(partial, path)
    return header


def _covering(
    chains: list[dict[str, Any]], upto: int, ref: PartitionRef
) -> dict[str, tuple[int, str, int]]:
    """chain → (head seq, head hash, checkpoint id) of the checkpoint covering its end."""
    if not chains:
        return {}
    params: dict[str, Any] = {
        "chains": [c["chain"] for c in chains],
        "seqs": [c["last"] for c in chains],
        "hashes": [c["hash"] for c in chains],
        "segment": [c["segment"] for c in chains],
        "upto": upto,
        # Legacy: entries of any time before the partitioned log.
        "since": datetime.combine(ref.part.replace(day=1), datetime.min.time(), UTC)
        if ref.kind != "legacy"
        else datetime(1970, 1, 1, tzinfo=UTC),
    }
    with connection.cursor() as cursor:
        cursor.execute(PQ["partition_covering_checkpoints"], params)
        return {chain: (seq, digest, cp_id) for chain, seq, digest, cp_id in cursor.fetchall()}


def _chain_entry(chain: dict[str, Any], head: tuple[int, str, int]) -> dict[str, Any]:
    entry = {
        "chain": chain["chain"],
        "head_seq": head[0],
        "head_hash": head[1],
        "checkpoint_id": head[2],
    }
    if chain["low"] != 1:  # a segment after the first: where it continues the chain
        entry |= {"from_seq": chain["low"], "from_hash": chain["prev"]}
    return entry


def _entry_lines(chains: list[dict[str, Any]]) -> Iterator[bytes]:
    """Each entry as the canonical line {chain_hash, entry, prev_hash} (as audit.archive)."""
    if not chains:
        return
    params: dict[str, Any] = {
        "chains": [c["chain"] for c in chains],
        "lows": [c.get("from_seq", 1) for c in chains],
        "heads": [c["head_seq"] for c in chains],
    }
    with connection.connection.cursor(name="audit_partition_entries") as cursor:
        cursor.itersize = BATCH_ROWS
        cursor.execute(PQ["partition_archive_entries"], params)
        for row in cursor:
            yield entry_line(*row)


def archive_file_name(ref: PartitionRef, now: datetime | None = None) -> str:
    """The file name the dispatcher gives a partition's archive."""
    now = now or datetime.now(UTC)
    return f"{ref.name}.{now:%Y%m%dT%H%M%SZ}.jsonl.gz"


def _jobs_left(ref: PartitionRef, first_job_month: date | None) -> bool:
    """Whether a job of the partition is still in the database (an index probe on the
    jobs' created_at), before the scan of its chains that open_chains is."""
    if ref.kind == "ops":
        return False
    low = datetime(1970, 1, 1, tzinfo=UTC)
    if ref.kind == "job":
        low = datetime.combine(ref.part, datetime.min.time(), UTC)
        nxt = date(ref.part.year + ref.part.month // 12, ref.part.month % 12 + 1, 1)
        high = datetime.combine(nxt, datetime.min.time(), UTC)
    elif first_job_month is not None:  # legacy: the jobs from before the partitioned log
        high = datetime.combine(first_job_month, datetime.min.time(), UTC)
    else:
        high = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(PQ["partition_jobs_left"], {"low": low, "high": high, "part": ref.part})
        return bool(cursor.fetchone()[0])


def partitions_ready(*, skip: set[str] | None = None) -> list[PartitionRef]:
    """The attached partitions whose month has ended and whose job chains are all
    closed: each may be archived now. Those named in `skip` (archived already: their
    chains stay closed) are taken as ready without a look."""
    today = timezone.now().date()
    partitions = list_partitions()
    months = [p.month for p in partitions if p.kind == "job" and p.month is not None]
    first_job_month = min(months, default=None)
    ready = []
    for partition in partitions:
        if partition.kind == "legacy":
            ref = PartitionRef(LEGACY_PARTITION, "legacy", LEGACY_PART)
        else:
            assert partition.month is not None
            part = partition.month if partition.kind == "job" else partition.month.replace(day=2)
            ref = PartitionRef(partition.name, partition.kind, part)
        if not ref.month_ended(today):
            continue
        if ref.name in (skip or set()) or (
            not _jobs_left(ref, first_job_month) and open_chains(ref)[0] == 0
        ):
            ready.append(ref)
    return ready


# How often the dispatcher's step looks: a partition becomes ready once a month.
ARCHIVE_EVERY = timedelta(hours=1)
_last_run: datetime | None = None


def archive_step(*, now: datetime | None = None) -> int:
    """The dispatcher's step, at most once an hour (ARCHIVE_EVERY): with AUDIT_ARCHIVE_DIR
    set, archive each ready partition that has no archive yet into that directory; set
    the gauge of the partitions ready to detach (ready, and archived). It reads the audit
    log and records archives; it never detaches. Returns how many it archived."""
    global _last_run
    now = now or datetime.now(UTC)
    if _last_run is not None and now - _last_run < ARCHIVE_EVERY:
        return 0
    _last_run = now
    directory = settings.AUDIT_ARCHIVE_DIR
    written = 0
    done = set(AuditPartitionArchive.objects.values_list("partition", flat=True))
    ready = partitions_ready(skip=done)
    for ref in ready:
        if ref.name in done or not directory:
            continue
        path = os.path.join(directory, archive_file_name(ref))
        try:
            archive_partition(ref, path)
            written += 1
        except PartitionError as exc:  # e.g. no covering checkpoint yet: next time
            log.info("audit_partition_not_archived", partition=ref.name, reason=str(exc))
    done = set(AuditPartitionArchive.objects.values_list("partition", flat=True))
    AUDIT_PARTITIONS_READY_TO_DETACH.set(sum(1 for ref in ready if ref.name in done))
    return written
