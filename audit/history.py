"""The whole audit history once partitions were detached: the live database plus a
directory of archives (docs/operations/audit-archives.md#verifying-the-whole-history).

The ops chain's `audit_partition_detached` entries say which partitions left the
database, with their archive's sha256 (audit.detach). From them:

- `live_boundary` tells live verification (audit.verification) where a chain whose older
  segments went starts (the ops chain: after the last detached segment's entry), which
  heads of the checkpoints may be gone with a partition, and that every partition from the
  oldest known month to the current one is attached or was detached by audit_detach (a
  partition dropped directly shows as `partition_missing`);
- `verify_history` (`verify_audit_chain --archives DIR`) finds each detached partition's
  archive in DIR by its sha256, verifies it offline, compares the checkpoints it carries
  with the database's (which are never removed), follows the ops chain from segment to
  segment into the live database, and then verifies the live database with every head a
  checkpoint names either live or in a verified archive. A missing archive is reported
  by the partition's and the file's names.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import IO, Any, cast

from django.db import connection
from django.utils import timezone

from audit.archive import ArchiveUnreadable, verify_archive
from audit.canonical import GENESIS_HASH
from audit.detach import DETACHED, Detached, detached_partitions, file_sha256
from audit.partition_archive import PQ
from audit.partitions import LEGACY_PARTITION, list_partitions
from audit.services import OPS_CHAIN
from audit.signing import public_key_text
from audit.verification import (
    MAX_PROBLEMS,
    Problem,
    VerificationReport,
    _check_heads,
    _job_of,
    audit_verify,
)

# A file in the archives directory larger than this is not read for its header line.
MAX_HEADER_BYTES = 512 * 1024 * 1024


@dataclass
class Boundary:
    """Where the live database's history begins (see the module's docstring)."""

    detached: list[Detached] = field(default_factory=list)
    starts: dict[str, tuple[int, str]] = field(default_factory=dict)
    archived_upto: int = 0  # the newest checkpoint a detached partition's archive carries
    archived_heads: dict[str, int] | None = None  # chain → head seq, from verified archives

    def check_heads(
        self,
        report: VerificationReport,
        genuine: list[int],
        selected: list[str] | None,
        since: datetime | None,
    ) -> None:
        if not self.detached and self.archived_heads is None:
            _check_heads(report, genuine, selected, since)
            return
        if not genuine:
            return
        archived = self.archived_heads or {}
        params = {
            "genuine": genuine,
            "chains": selected,
            "since": since,
            "limit": MAX_PROBLEMS,
            "s_chains": list(self.starts),
            "s_seqs": [s[0] for s in self.starts.values()],
            "archived": self.archived_heads is not None,
            "a_chains": list(archived),
            "a_heads": list(archived.values()),
            "archived_upto": self.archived_upto,
        }
        with connection.cursor() as cursor:
            cursor.execute(PQ["verify_heads_detached"], params)
            rows = cursor.fetchall()
        report.heads_checked += rows[0][0]
        report.heads_deferred += rows[0][1]
        for _n, _d, cp_id, chain, seq, head_hash, found in rows:
            if cp_id is None:
                continue
            where = "neither in the database nor in a verified archive"
            report.add(
                Problem(
                    kind="head_missing" if found is None else "head_changed",
                    message=(
                        f"head seq {seq} recorded by the checkpoint is {where}"
                        if found is None
                        else f"head seq {seq} has chain_hash {found}, the checkpoint "
                        f"recorded {head_hash}"
                    ),
                    chain=chain,
                    job_id=_job_of(chain),
                    seq=seq,
                    checkpoint_id=cp_id,
                )
            )

    def check_partitions(self, report: VerificationReport) -> None:
        """Every partition from the oldest month known to the current one is attached or
        was detached by audit_detach; the legacy partition too."""
        gone = {d.partition for d in self.detached}
        present = list_partitions()
        names = {p.name for p in present}
        if LEGACY_PARTITION not in names and LEGACY_PARTITION not in gone:
            report.add(_missing(LEGACY_PARTITION))
        months = [p.month for p in present if p.month is not None]
        months += [
            date.fromisoformat(d.part).replace(day=1) for d in self.detached if d.kind != "legacy"
        ]
        if not months:
            return
        today = timezone.now().date()
        year, month = min(months).year, min(months).month
        while (year, month) <= (today.year, today.month):
            for kind in ("job", "ops"):
                name = f"audit_logs_{kind}_{year:04d}_{month:02d}"
                if name not in names and name not in gone:
                    report.add(_missing(name))
            year, month = (year + 1, 1) if month == 12 else (year, month + 1)

    def checkpoint_ids(self) -> None:
        """archived_upto from the checkpoints the detached partitions name."""
        for detached in self.detached:
            with connection.cursor() as cursor:
                cursor.execute(PQ["checkpoint_by_hash"], {"hash": detached.checkpoint_hash})
                row = cursor.fetchone()
            if row is not None:
                self.archived_upto = max(self.archived_upto, int(row[0]))


def _missing(name: str) -> Problem:
    return Problem(
        kind="partition_missing",
        message=f"partition {name} is neither in the database nor detached by audit_detach "
        "(no `audit_partition_detached` entry names it): its rows are gone without an archive",
    )


def live_boundary(extra: list[Detached] | None = None) -> Boundary:
    """The boundary of the live database, from the ops chain's detach entries (and
    `extra`: those read from archives of ops partitions detached since)."""
    live = detached_partitions()
    seen: dict[str, Detached] = {d.partition: d for d in (extra or [])}
    for detached in live:
        seen[detached.partition] = detached
    boundary = Boundary(detached=list(seen.values()))
    for detached in live:  # in the order they went: the last one wins
        for chain, seq, digest in detached.segments:
            boundary.starts[chain] = (seq + 1, digest)
    boundary.checkpoint_ids()
    return boundary


@dataclass
class _Archive:
    path: str
    sha256: str
    header: dict[str, Any] | None

    @property
    def partition(self) -> str | None:
        part = (self.header or {}).get("partition")
        return part.get("name") if isinstance(part, dict) else None


def _scan(directory: str) -> list[_Archive]:
    found = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if not os.path.isfile(path) or name.endswith(".partial"):
            continue
        digest, size = file_sha256(path)
        header = None
        if size <= MAX_HEADER_BYTES:
            try:
                with gzip.open(path, "rb") as file:
                    header = json.loads(file.readline())
            except (OSError, EOFError, zlib.error, ValueError):
                header = None
        found.append(_Archive(path, digest, header if isinstance(header, dict) else None))
    return found


class _Tap:
    """A file for verify_archive that also collects the ops chain's detach entries."""

    def __init__(self, file: IO[bytes]) -> None:
        self.file = file
        self.detached: list[Detached] = []

    def readline(self) -> bytes:
        return self.file.readline()

    def __iter__(self) -> Iterator[bytes]:
        for line in self.file:
            if DETACHED.encode() in line:
                try:
                    entry = json.loads(line)["entry"]
                    if entry["chain"] == OPS_CHAIN and entry["event_type"] == DETACHED:
                        self.detached.append(Detached.from_data(entry["data"]))
                except (ValueError, KeyError, TypeError):
                    pass  # the walk reports the line
            yield line


def _named(problem: Problem, name: str) -> Problem:
    return Problem(
        kind=problem.kind,
        message=f"archive {name}: {problem.message}",
        chain=problem.chain,
        job_id=problem.job_id,
        seq=problem.seq,
        checkpoint_id=problem.checkpoint_id,
    )


def _verify_file(
    report: VerificationReport, archive: _Archive, public_key: Any
) -> tuple[bool, list[Detached]]:
    name = os.path.basename(archive.path)
    try:
        with gzip.open(archive.path, "rb") as file:
            tap = _Tap(cast(IO[bytes], file))
            found = verify_archive(cast(IO[bytes], tap), public_key=public_key)
    except (ArchiveUnreadable, OSError) as exc:
        report.add(Problem(kind="archive_unreadable", message=f"archive {name}: {exc}"))
        return False, []
    report.rows_checked += found.rows_checked
    report.chains_checked += found.chains_checked
    report.checkpoints_checked += found.checkpoints_checked
    for problem in found.problems:
        report.add(_named(problem, name))
    report.problems_total += found.problems_total - len(found.problems)
    return found.ok, tap.detached


def _check_checkpoints_live(report: VerificationReport, archive: _Archive) -> None:
    """The checkpoints an archive carries are the database's (never removed): a
    checkpoint forged into an archive, or one missing, is named."""
    checkpoints = (archive.header or {}).get("checkpoints") or []
    ids = [
        cp.get("id") for cp in checkpoints if isinstance(cp, dict) and isinstance(cp.get("id"), int)
    ]
    with connection.cursor() as cursor:
        cursor.execute(PQ["checkpoints_by_id"], {"ids": ids})
        live = {cp_id: (digest, payload) for cp_id, digest, payload in cursor.fetchall()}
    name = os.path.basename(archive.path)
    for cp in checkpoints:
        cp_id = cp.get("id") if isinstance(cp, dict) else None
        if live.get(cp_id) != (cp.get("checkpoint_hash"), cp.get("payload")):
            report.add(
                Problem(
                    kind="checkpoint_forged",
                    message=f"archive {name}: checkpoint {cp_id} is not the database's "
                    "(its hash or payload differs, or the database has no such checkpoint)",
                    checkpoint_id=cp_id if isinstance(cp_id, int) else None,
                )
            )


def _check_record(report: VerificationReport, archive: _Archive, detached: Detached) -> None:
    """The archive is the one the detach entry names: partition, key, checkpoint and
    where each segment chain ends."""
    header = archive.header or {}
    name = os.path.basename(archive.path)
    wrong = []
    if archive.partition != detached.partition:
        wrong.append(f"it is the archive of {archive.partition}")
    if detached.key_id and header.get("key_id") != detached.key_id:
        wrong.append(
            f"its key id is {header.get('key_id')!r}, the detach recorded {detached.key_id!r}"
        )
    if header.get("checkpoint_hash") != detached.checkpoint_hash:
        wrong.append("it names another checkpoint than the detach recorded")
    ends = {
        (s.get("chain"), s.get("last_seq"), s.get("last_hash"))
        for s in header.get("segments", [])
        if isinstance(s, dict)
    }
    if ends and ends != set(detached.segments):
        wrong.append("its segments end elsewhere than the detach recorded")
    if wrong:
        report.add(
            Problem(
                kind="archive_mismatch",
                message=f"archive {name} of partition {detached.partition}: " + "; ".join(wrong),
            )
        )


def _check_links(report: VerificationReport, archives: list[tuple[Detached, _Archive]]) -> None:
    """Each segment chain (the ops chain) goes on from one archived segment to the
    next: an archive's `from_seq`/`from_hash` follows the previous one's segment end."""
    ends: dict[str, tuple[int, str]] = {}
    ordered = sorted(
        (pair for pair in archives if pair[0].kind in ("legacy", "ops")),
        key=lambda pair: pair[0].part,
    )
    for detached, archive in ordered:
        name = os.path.basename(archive.path)
        for chain in (archive.header or {}).get("chains", []):
            if not isinstance(chain, dict) or str(chain.get("chain", "")).startswith("job:"):
                continue
            start = (chain.get("from_seq", 1), chain.get("from_hash", GENESIS_HASH))
            before = ends.get(str(chain.get("chain")), (0, GENESIS_HASH))
            if start != (before[0] + 1, before[1]):
                report.add(
                    Problem(
                        kind="segment_unlinked",
                        message=f"archive {name}: chain {chain.get('chain')} starts at seq "
                        f"{start[0]}, not after the previous segment's end (seq {before[0]})",
                        chain=str(chain.get("chain")),
                    )
                )
        for chain, seq, digest in detached.segments:
            ends[chain] = (seq, digest)


def verify_history(directory: str, *, public_key: Any = None) -> VerificationReport:
    """The live database plus the archives in `directory` (see the module's docstring).
    `public_key`: what verify_archive takes (the base64 text of one key; by default the
    deployment's own)."""
    report = VerificationReport()
    key = public_key.strip() if isinstance(public_key, str) else public_key
    key = key or public_key_text()
    files = _scan(directory)
    by_sha = {f.sha256: f for f in files}
    queue = list(detached_partitions())
    done: dict[str, Detached] = {}
    pairs: list[tuple[Detached, _Archive]] = []
    archived: dict[str, int] = {}
    while queue:
        detached = queue.pop(0)
        if detached.partition in done:
            continue
        done[detached.partition] = detached
        archive = by_sha.get(detached.sha256)
        if archive is None:
            _report_absent(report, detached, files, directory, key)
            continue
        ok, more = _verify_file(report, archive, key)
        queue += more
        _check_checkpoints_live(report, archive)
        _check_record(report, archive, detached)
        pairs.append((detached, archive))
        for chain in (archive.header or {}).get("chains", []):
            if ok and isinstance(chain, dict) and isinstance(chain.get("head_seq"), int):
                name = str(chain.get("chain"))
                archived[name] = max(archived.get(name, 0), chain["head_seq"])
    _check_links(report, pairs)
    boundary = live_boundary(extra=list(done.values()))
    boundary.archived_heads = archived
    live = audit_verify(history=boundary)
    report.rows_checked += live.rows_checked
    report.chains_checked += live.chains_checked
    report.checkpoints_checked += live.checkpoints_checked
    report.heads_checked += live.heads_checked
    report.heads_deferred += live.heads_deferred
    for problem in live.problems:
        report.add(problem)
    report.problems_total += live.problems_total - len(live.problems)
    report.seconds += live.seconds
    return report


def _report_absent(
    report: VerificationReport,
    detached: Detached,
    files: list[_Archive],
    directory: str,
    key: Any,
) -> None:
    """No file in the directory has the sha256 the detach recorded: a changed one (by
    its name or its header's partition) is verified to say what changed; else the
    archive is missing."""
    changed = [
        f
        for f in files
        if os.path.basename(f.path) == detached.file_name or f.partition == detached.partition
    ]
    for archive in changed:
        name = os.path.basename(archive.path)
        report.add(
            Problem(
                kind="archive_changed",
                message=f"archive {name} of partition {detached.partition} has sha256 "
                f"{archive.sha256}, the detach recorded {detached.sha256}",
            )
        )
        _verify_file(report, archive, key)
        _check_checkpoints_live(report, archive)
    if not changed:
        report.add(
            Problem(
                kind="archive_missing",
                message=f"partition {detached.partition} was detached; its archive "
                f"{detached.file_name} (sha256 {detached.sha256}) is not in {directory}",
            )
        )
