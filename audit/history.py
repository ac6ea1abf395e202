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
from dataclasses import dataclass
from typing import IO, Any, cast

from django.db import connection

from audit.archive import ArchiveUnreadable, verify_archive
from audit.boundary import live_boundary
from audit.canonical import GENESIS_HASH
from audit.detach import DETACHED, Detached, detached_partitions, file_sha256
from audit.partition_archive import PQ
from audit.services import OPS_CHAIN
from audit.signing import public_key_text
from audit.verification import (
    Problem,
    VerificationReport,
    audit_verify,
)

# A file in the archives directory larger than this is not read for its header line.
MAX_HEADER_BYTES = 512 * 1024 * 1024


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
