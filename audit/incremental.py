"""Incremental verification: what was appended after a checkpoint already verified
(docs/operations/audit-archives.md#incremental-verification).

The starting checkpoint is trusted because it came from outside the database: the
export file (AUDIT_CHECKPOINT_EXPORT, audit.checkpoints.checkpoint_export) or a hash the
operator gives. The database's copy of it must hash to that value, carry a valid
signature and link to the checkpoint before it. From there:

1. every later checkpoint verifies (hash, HMAC, Ed25519 with a keyring, link), and every
   checkpoint the export file holds after the starting one is among them;
2. every entry with an id above the trusted checkpoint's last_audit_id is streamed in id
   order (a range scan of the primary key, whatever partition holds it), hashed, and
   linked to the entry before it in its chain: a new one, or the head the trusted
   checkpoint (or a later part of the same checkpoint) names, or else, for a chain whose
   previous head no verified checkpoint names, the row the database holds (its hash
   recomputed; counted as `links_on_database`: that link rests on the database);
3. the heads each later checkpoint names are exactly the heads of the entries in its id
   range (a forged, changed or removed entry shows as a head that differs, is missing or
   is not named).

What it does not prove: the entries before the checkpoint (the full walk does that) and
the job rows' agreement with their chains (AUDIT_VERIFY_CHECKS, full walk only).
"""

from __future__ import annotations

import bisect
import gc
import hashlib
import json
import time
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from audit.canonical import GENESIS_HASH
from audit.keyring import Keyring
from audit.queries import QUERIES as AUDIT_QUERIES
from audit.tree import HeadsMismatch, checkpoint_heads
from audit.verification import (
    MAX_PROBLEMS,
    Problem,
    VerificationReport,
    _batches,
    _check_heads,
    _job_of,
    _row_problem,
    checkpoint_problems,
)
from core.queries import load

QUERIES = load(Path(__file__).with_name("incremental.sql"))
# Pairs looked up per round trip when first entries link to rows no checkpoint names.
LOOKUP_CHUNK = 10_000


class StartUnknown(ValueError):
    """No trusted starting checkpoint can be named (exit status 2): no export file and no
    hash given, or an export file that holds no checkpoint."""


@dataclass(frozen=True)
class Trusted:
    """The checkpoint verification starts from, as known outside the database."""

    checkpoint_hash: str
    checkpoint_id: int | None = None  # from the export line; None: a bare hash
    source: str = "given hash"
    # The exported checkpoints after it, (id, hash): each must be a genuine later one.
    exported_after: tuple[tuple[int, str], ...] = ()


@dataclass
class IncrementalReport(VerificationReport):
    from_checkpoint_id: int | None = None
    from_checkpoint_hash: str = ""
    from_audit_id: int = 0  # entries with an id above this were verified
    to_audit_id: int = 0
    to_checkpoint_id: int | None = None
    trusted_source: str = ""
    links_on_database: int = 0
    # Chains with entries above the newest checkpoint's last_audit_id: hashed and linked,
    # not yet named by any checkpoint.
    uncovered_chains: int = 0
    problems: list[Problem] = field(default_factory=list)

    def range_text(self) -> str:
        cps = (
            f"checkpoints {self.from_checkpoint_id}..{self.to_checkpoint_id}"
            if self.to_checkpoint_id and self.to_checkpoint_id != self.from_checkpoint_id
            else f"checkpoint {self.from_checkpoint_id}"
        )
        return f"audit ids {self.from_audit_id + 1}..{self.to_audit_id}, {cps}"


def trusted_from_export(path: str, wanted: str | None = None) -> Trusted:
    """The newest checkpoint of an export file, or the one whose hash is `wanted` (a hash
    the file does not hold is still trusted: the operator gave it)."""
    try:
        with open(path, encoding="utf-8") as file:
            lines = [line for line in file if line.strip()]
    except OSError as exc:
        if wanted:
            return Trusted(wanted)
        raise StartUnknown(f"cannot read the checkpoint export {path}: {exc}") from exc
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            records.append((str(record["checkpoint_hash"]).lower(), int(record["id"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise StartUnknown(f"{path}:{number} is not an exported checkpoint line") from exc
    if wanted:
        for digest, cp_id in reversed(records):
            if digest == wanted:
                after = tuple((i, d) for d, i in records if i > cp_id)
                return Trusted(digest, cp_id, f"{path} (given hash)", after)
        return Trusted(wanted)
    if not records:
        raise StartUnknown(f"the checkpoint export {path} holds no checkpoint yet")
    digest, cp_id = max(records, key=lambda r: r[1])
    return Trusted(digest, cp_id, path)


def trusted_start(wanted: str | None) -> Trusted:
    """The trusted starting checkpoint: `wanted`, or the newest of the export file."""
    path = settings.AUDIT_CHECKPOINT_EXPORT
    if path:
        return trusted_from_export(path, wanted)
    if wanted:
        return Trusted(wanted)
    raise StartUnknown(
        "no starting checkpoint: give its hash (--since-checkpoint HASH) or set "
        "AUDIT_CHECKPOINT_EXPORT (the file the checkpoints are exported to)"
    )


@dataclass(frozen=True)
class _IdStream:
    """One id range (low, high] of the new entries, read by its own cursor."""

    low: int
    high: int

    def params(self, _selected: Any) -> dict[str, Any]:
        return {"low": self.low, "high": self.high}


def _id_streams(low: int, high: int) -> list[_IdStream]:
    wanted = settings.AUDIT_VERIFY_STREAMS
    # Other connections share the snapshot only of an outermost transaction.
    if (
        wanted < 2
        or high - low < settings.AUDIT_VERIFY_PARALLEL_MIN_ROWS
        or len(connection.atomic_blocks) != 1
    ):
        return [_IdStream(low, high)]
    cuts = [low + (high - low) * i // wanted for i in range(wanted)] + [high]
    return [_IdStream(a, b) for a, b in pairwise(cuts) if b > a]


def audit_verify_incremental(
    trusted: Trusted, *, keyring: Keyring | None = None
) -> IncrementalReport:
    """Verify what came after `trusted` (see the module docstring); never raises for
    tampering, reports it. One REPEATABLE READ READ ONLY snapshot when it can."""
    started = time.perf_counter()
    report = IncrementalReport(
        from_checkpoint_hash=trusted.checkpoint_hash, trusted_source=trusted.source
    )
    with transaction.atomic():
        if len(connection.atomic_blocks) == 1:
            with connection.cursor() as cursor:
                cursor.execute(AUDIT_QUERIES["read_only_snapshot"])
        start = _check_start(report, trusted, keyring)
        if start is not None:
            genuine = _verify_after(report, start, keyring)
            for cp_id, digest in trusted.exported_after:
                if digest not in genuine:
                    report.add(
                        Problem(
                            kind="checkpoint_missing",
                            message=f"exported checkpoint {digest} is not a genuine checkpoint "
                            "in the database: history after it was deleted or rewritten",
                            checkpoint_id=cp_id,
                        )
                    )
    report.seconds = time.perf_counter() - started
    return report


def _signature_problem(row: tuple[Any, ...], keyring: Keyring | None) -> str | None:
    if keyring is None:
        return None
    if not row[8]:
        return "carries no Ed25519 signature"
    return keyring.check(
        key_id=row[4],
        signature=row[8],
        message=bytes.fromhex(row[3]),
        at=row[9],
        what="Ed25519 signature",
    )


def _check_start(
    report: IncrementalReport, trusted: Trusted, keyring: Keyring | None
) -> tuple[Any, ...] | None:
    """The database's copy of the trusted checkpoint, when it is that checkpoint and
    genuine (hash, signature, link to the one before); None after reporting why not."""
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["checkpoint_by_hash"], {"hash": trusted.checkpoint_hash})
        found = cursor.fetchall()
        by_id = None
        if trusted.checkpoint_id is not None:
            cursor.execute(QUERIES["checkpoint_by_id"], {"id": trusted.checkpoint_id})
            by_id = cursor.fetchone()
    report.checkpoints_checked += 1
    name = f"{trusted.checkpoint_hash} (from {trusted.source})"
    row = next((r for r in found if trusted.checkpoint_id in (None, r[0])), None)
    if row is None:
        if by_id is not None:
            message = (
                f"the database's checkpoint {by_id[0]} has hash {by_id[3]}, the trusted "
                f"checkpoint is {name}: the database's copy differs"
            )
        else:
            message = f"the trusted checkpoint {name} is not in the database"
        report.add(
            Problem(kind="checkpoint_differs", message=message, checkpoint_id=trusted.checkpoint_id)
        )
        return None
    report.from_checkpoint_id = row[0]
    report.from_audit_id = report.to_audit_id = row[1]
    report.to_checkpoint_id = row[0]
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["checkpoint_before"], {"id": row[0]})
        before = cursor.fetchone()
    broken = checkpoint_problems(row[:8], before[0] if before else GENESIS_HASH, heads=row[10])
    signature = _signature_problem(row, keyring)
    if signature:
        broken.append(signature)
    if broken:
        report.add(
            Problem(
                kind="checkpoint_differs",
                message=f"the database's copy of the trusted checkpoint {name}: "
                + "; ".join(broken),
                checkpoint_id=row[0],
            )
        )
        return None
    return row


def _verify_after(
    report: IncrementalReport, start: tuple[Any, ...], keyring: Keyring | None
) -> set[str]:
    """Steps 1 to 3 of the module docstring; the hashes of the genuine later checkpoints."""
    start_id, start_last = start[0], start[1]
    genuine: set[str] = set()
    # 1. The later checkpoints, chained from the trusted one.
    expected_prev = start[3]
    intervals: list[int] = []  # the distinct last_audit_ids above start_last, ascending
    named: dict[int, dict[str, tuple[int, str]]] = {}  # last_audit_id -> heads
    trusted_heads: dict[str, tuple[int, str]] = dict(_heads(start[7], start[10]))
    same_group: list[int] = []  # later parts with the trusted one's last_audit_id
    genuine_after = True
    with connection.connection.cursor(name="audit_incremental_checkpoints", binary=True) as cur:
        cur.itersize = 4
        cur.execute(QUERIES["checkpoints_after"], {"id": start_id})
        for row in cur:
            report.checkpoints_checked += 1
            broken = checkpoint_problems(row[:8], expected_prev, heads=row[10])
            signature = _signature_problem(row, keyring)
            if signature:
                broken.append(signature)
            expected_prev = row[3]
            if broken:
                genuine_after = False
                report.add(
                    Problem(
                        kind="checkpoint_broken", message="; ".join(broken), checkpoint_id=row[0]
                    )
                )
                continue
            report.to_checkpoint_id = row[0]
            genuine.add(row[3])
            heads = _heads(row[7], row[10])
            if row[1] == start_last:
                same_group.append(row[0])
                trusted_heads.update(heads)
                continue
            if row[1] < start_last:
                report.add(
                    Problem(
                        kind="checkpoint_broken",
                        message=f"last_audit_id {row[1]} is below the trusted one's {start_last}",
                        checkpoint_id=row[0],
                    )
                )
                continue
            if not intervals or intervals[-1] != row[1]:
                intervals.append(row[1])
            named.setdefault(row[1], {}).update(heads)
    # Heads of old entries named by later parts of the trusted checkpoint still exist.
    _check_heads(report, same_group, None, None)
    # 2. The new entries.
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["new_rows_range"], {"last_id": start_last})
        (high,) = cursor.fetchone()
    if high is None:
        _check_named_heads(report, intervals, named, {})
        return genuine
    report.to_audit_id = high
    walk = _walk_new_rows(report, start_last, high, intervals)
    # 3. Each chain's first new entry links to its predecessor.
    _check_links(report, walk.firsts, trusted_heads, start_last)
    # 4. The heads each later checkpoint names are the heads of the entries in its range.
    if genuine_after:
        _check_named_heads(report, intervals, named, walk.computed)
    report.uncovered_chains = walk.uncovered
    return genuine


def _heads(payload: bytes, heads: Any) -> dict[str, tuple[int, str]]:
    """The heads a checkpoint names: in its payload (version 1) or its heads column,
    which checkpoint_problems checked against the signed heads_root (version 2)."""
    try:
        named = checkpoint_heads(bytes(payload).decode("utf-8"), heads)
        return {str(chain): (int(seq), str(digest)) for chain, seq, digest in named}
    except (ValueError, KeyError, TypeError, HeadsMismatch):
        return {}


@dataclass
class _Walked:
    firsts: list[tuple[str, int, str]]  # (chain, seq, prev_hash) of each chain's first
    computed: dict[int, dict[str, tuple[int, str]]]  # interval -> chain -> head
    uncovered: int


def _walk_new_rows(report: IncrementalReport, low: int, high: int, intervals: list[int]) -> _Walked:
    """Stream the entries with low < id <= high in id order; check each hash, its
    canonical fields and its link to the previous new entry of its chain; note each
    chain's first entry and the heads per checkpoint range.

    The cyclic garbage collector is off meanwhile: the heads of a day's chains (a
    hundred thousand tuples) would make each of its full passes longer, and nothing
    here makes a cycle.
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _walk(report, low, high, intervals)
    finally:
        if collecting:
            gc.enable()


def _walk(report: IncrementalReport, low: int, high: int, intervals: list[int]) -> _Walked:
    streams = _id_streams(low, high)
    report.streams = len(streams)
    sha256 = hashlib.sha256
    fromhex = bytes.fromhex
    # Per stream: the heads (chain -> (seq, hash)) per checkpoint range, newest range
    # last, and the chains' first entries in the stream.
    heads: list[dict[int, dict[str, tuple[int, str]]]] = [{} for _ in streams]
    firsts: list[list[tuple[str, int, str]]] = [[] for _ in streams]
    positions = [bisect.bisect_left(intervals, s.low + 1) for s in streams]
    suspects: list[tuple[Any, ...]] = []
    overflow = rows = 0
    open_end = len(intervals)  # the range above the newest checkpoint
    for index, batch in _batches(streams, None, QUERIES["new_rows"]):
        rows += len(batch)
        first, head = firsts[index], heads[index]
        position = positions[index]
        boundary = intervals[position] if position < open_end else high + 1
        current = head.setdefault(position, {})
        for row_id, chain, seq, payload, prev, stored, prefix, suffix in batch:
            if row_id > boundary:
                position = bisect.bisect_left(intervals, row_id)
                boundary = intervals[position] if position < open_end else high + 1
                current = head.setdefault(position, {})
            try:
                hash_ok = sha256(fromhex(prev) + payload).hexdigest() == stored
            except ValueError:
                hash_ok = False
            known = current.get(chain)
            if known is None and len(head) > 1:  # the chain's head in an earlier range
                known = next((h[chain] for h in reversed(head.values()) if chain in h), None)
            if known is None:
                first.append((chain, seq, prev))
                link_ok = True
            else:
                link_ok = seq == known[0] + 1 and prev == known[1]
            if not (
                hash_ok and link_ok and payload.startswith(prefix) and payload.endswith(suffix)
            ):
                if len(suspects) < MAX_PROBLEMS:
                    expected = (known[0] + 1, known[1]) if known else (seq, prev)
                    suspects.append((chain, seq, payload, prev, stored, *expected))
                else:
                    overflow += 1
            current[chain] = (seq, stored)
        positions[index] = position
    report.rows_checked += rows
    # Stitch the streams: a chain's first entry in a later stream continues its last
    # entry in the stream before (streams are consecutive id ranges).
    merged: dict[str, tuple[int, str]] = {}
    chain_firsts: list[tuple[str, int, str]] = []
    for index in range(len(streams)):
        for chain, seq, prev in firsts[index]:
            known = merged.get(chain)
            if known is None:
                chain_firsts.append((chain, seq, prev))
            elif (seq, prev) != (known[0] + 1, known[1]):
                suspects.append((chain, seq, b"", prev, "", known[0] + 1, known[1]))
        for position in sorted(heads[index]):
            merged.update(heads[index][position])
    report.chains_checked += len(merged)
    computed: dict[int, dict[str, tuple[int, str]]] = {}
    for per_stream in heads:
        for position, chains in per_stream.items():
            computed.setdefault(position, {}).update(chains)
    for suspect in sorted(suspects, key=lambda s: (s[0], s[1])):
        problem = _row_problem(*suspect) if suspect[2] else _gap(*suspect)
        if problem is not None:
            report.add(problem)
    report.problems_total += overflow
    uncovered = len(computed.get(open_end, {}))
    return _Walked(chain_firsts, computed, uncovered)


def _gap(
    chain: str, seq: int, _p: bytes, prev: str, _s: str, expected_seq: int, expected_prev: str
) -> Problem:
    return Problem(
        kind="row_broken",
        message=f"expected seq {expected_seq} with prev_hash {expected_prev}, found seq {seq} "
        f"with prev_hash {prev}",
        chain=chain,
        job_id=_job_of(chain),
        seq=seq,
    )


def _check_links(
    report: IncrementalReport,
    firsts: list[tuple[str, int, str]],
    trusted_heads: dict[str, tuple[int, str]],
    start_last: int,
) -> None:
    """Each chain's first new entry links to genesis, to the head a verified checkpoint
    names, or (no checkpoint names it) to the row the database holds before it."""
    lookups: list[tuple[str, int, str]] = []
    for chain, seq, prev in firsts:
        if seq == 1:
            if prev != GENESIS_HASH:
                report.add(_link(chain, seq, f"seq 1 has prev_hash {prev}, not the genesis hash"))
            continue
        named = trusted_heads.get(chain)
        if named is None:
            lookups.append((chain, seq, prev))
        elif named != (seq - 1, prev):
            report.add(
                _link(
                    chain,
                    seq,
                    f"links to seq {seq - 1} with hash {prev}; the trusted checkpoint names "
                    f"head seq {named[0]} with hash {named[1]}",
                )
            )
    for start in range(0, len(lookups), LOOKUP_CHUNK):
        chunk = lookups[start : start + LOOKUP_CHUNK]
        with connection.cursor() as cursor:
            cursor.execute(
                QUERIES["previous_entries"],
                {"chains": [c for c, _, _ in chunk], "seqs": [s - 1 for _, s, _ in chunk]},
            )
            found = {(r[0], r[1]): r[2:] for r in cursor.fetchall()}
        for chain, seq, prev in chunk:
            report.links_on_database += 1
            row = found.get((chain, seq - 1))
            if row is None or row[0] is None:
                report.add(_link(chain, seq, f"the entry before it (seq {seq - 1}) is missing"))
                continue
            row_id, row_prev, row_hash, payload = row
            try:
                recomputed = hashlib.sha256(bytes.fromhex(row_prev) + bytes(payload)).hexdigest()
            except ValueError:
                recomputed = ""
            if row_id > start_last or recomputed != row_hash or row_hash != prev:
                report.add(
                    _link(
                        chain,
                        seq,
                        f"links to seq {seq - 1} with hash {prev}; the database's entry "
                        f"{seq - 1} (id {row_id}) has hash {row_hash}, recomputed {recomputed}",
                    )
                )


def _link(chain: str, seq: int, message: str) -> Problem:
    return Problem(kind="link_broken", message=message, chain=chain, job_id=_job_of(chain), seq=seq)


def _check_named_heads(
    report: IncrementalReport,
    intervals: list[int],
    named: dict[int, dict[str, tuple[int, str]]],
    computed: dict[int, dict[str, tuple[int, str]]],
) -> None:
    """The heads each later checkpoint names against the heads of the entries in its id
    range: a missing, changed or unnamed head is a removed, rewritten or forged entry."""
    for position, last_id in enumerate(intervals):
        expected, actual = named.get(last_id, {}), computed.get(position, {})
        report.heads_checked += len(expected)
        for chain in sorted(expected.keys() | actual.keys()):
            want, have = expected.get(chain), actual.get(chain)
            if want == have:
                continue
            if want is None:
                message = (
                    f"entry seq {have[0] if have else '?'} lies in the range of the checkpoint "
                    f"ending at audit id {last_id}, which does not name this chain (a forged row?)"
                )
                kind = "head_unnamed"
            elif have is None:
                message = f"head seq {want[0]} named by the checkpoint is missing"
                kind = "head_missing"
            else:
                message = (
                    f"the checkpoint ending at audit id {last_id} names head seq {want[0]} "
                    f"hash {want[1]}; the entries end at seq {have[0]} hash {have[1]}"
                )
                kind = "head_changed"
            report.add(
                Problem(
                    kind=kind,
                    message=message,
                    chain=chain,
                    job_id=_job_of(chain),
                    seq=(want or have or (None,))[0],
                )
            )
