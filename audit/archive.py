"""Audit archives an auditor verifies offline (docs/security.md#audit-archives).

An archive is a gzip file of canonical JSON lines (audit.canonical): a header, then one
line per entry of the chains it holds, in (chain, seq) order. It holds the chains closed
before a date, each from seq 1 up to a head that a signed checkpoint names:

- every job chain whose last entry is `purged` (its job is gone; nothing more is
  appended to it);
- the ops chain, up to the newest head of it that those checkpoints name.

The header carries the checkpoints that name those heads, each with its payload so that
its hash can be recomputed, and the newest Ed25519-signed checkpoint created before the
date; the public key; the list of chains with their heads; and an Ed25519 signature of
the header itself, so that a chain left out whole shows too. Each checkpoint in it either
carries an Ed25519 signature that verifies under that key or is the parent (prev_hash) of
one that is authentic: a checkpoint written before the key existed is proved by the first
signed one after it. `verify_archive` needs the file and the public key, never the
database. Archiving deletes nothing.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import time
import zlib
from collections.abc import Iterator
from datetime import datetime
from typing import IO, Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from audit.canonical import canonical_bytes, chain_hash
from audit.keyring import Keyring
from audit.queries import QUERIES
from audit.report import Problem, VerificationReport
from audit.services import OPS_CHAIN, format_ts
from audit.signing import load_public_key, public_key_text, sign, verifies
from audit.tree import checkpoint_heads

FORMAT = "jobops-audit-archive"
VERSION = 1
# Signed checkpoints before the date tried as the archive's end; a signature by an older
# Ed25519 key does not verify under the current one (docs/operations/audit-archives.md).
CUTOFF_CANDIDATES = 1_000
BATCH_ROWS = 2_000


class ArchiveError(Exception):
    """The archive cannot be written (the message says why). `returncode` 1: the stored
    history is not as it was written; 2: nothing to archive before that date."""

    def __init__(self, message: str, returncode: int = 1) -> None:
        super().__init__(message)
        self.returncode = returncode


class ArchiveUnreadable(Exception):
    """Not an archive at all: not gzip, or no readable header (exit status 2)."""


def archive_write(*, until: datetime, path: str) -> dict[str, Any]:
    """Write the archive of the chains closed before `until` to `path`; return its header.

    One REPEATABLE READ READ ONLY transaction, so heads, checkpoints and entries come
    from one snapshot. The file is written beside `path` and renamed into place.
    """
    with transaction.atomic():
        if len(connection.atomic_blocks) == 1:  # outermost: nothing has run in it yet
            with connection.cursor() as cursor:
                cursor.execute(QUERIES["read_only_snapshot"])
        cutoff = _cutoff(until)
        with connection.cursor() as cursor:
            cursor.execute(QUERIES["archive_heads"], {"upto": cutoff, "ops": OPS_CHAIN})
            heads = sorted(cursor.fetchall())
        header: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "created_at": format_ts(timezone.now()),
            "until": format_ts(until),
            "public_key": public_key_text(),
            # The keyring's name of that key (docs/operations/keys.md#the-keyring).
            "key_id": settings.AUDIT_SIGNING_KEY_ID,
            "checkpoints": _checkpoints({cutoff, *(h[3] for h in heads)}),
            "chains": [
                {"chain": c, "head_seq": s, "head_hash": h, "checkpoint_id": i}
                for c, s, h, i in heads
            ],
        }
        header["signature"] = sign(canonical_bytes(header))
        partial = f"{path}.partial"
        try:
            # No name and no time in gzip's header: the same history, the same bytes.
            with open(partial, "wb") as raw, gzip.GzipFile("", "wb", fileobj=raw, mtime=0) as file:
                file.write(canonical_bytes(header) + b"\n")
                for line in _entry_lines(heads):
                    file.write(line + b"\n")
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise
    os.replace(partial, path)
    return header


def _cutoff(until: datetime) -> int:
    """The id of the newest checkpoint before `until` signed under the current key."""
    public_key = load_public_key(public_key_text())
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["archive_cutoff"], {"until": until, "limit": CUTOFF_CANDIDATES})
        for cp_id, digest, signature in cursor.fetchall():
            if verifies(public_key, signature, bytes.fromhex(digest)):
                return int(cp_id)
    raise ArchiveError(
        f"no checkpoint created before {format_ts(until)} is signed with the current "
        "Ed25519 key: run `manage.py audit_checkpoint` or choose a later date",
        returncode=2,
    )


def _checkpoints(needed: set[int]) -> list[dict[str, Any]]:
    """The checkpoints of `needed`, each followed by the ones up to the first after it that
    is signed under the current key (those prove it through their prev_hash)."""
    public_key = load_public_key(public_key_text())
    taken: list[dict[str, Any]] = []
    run: list[dict[str, Any]] = []
    # Server-side: a payload names up to MAX_HEADS heads, and most are passed over.
    with connection.connection.cursor(name="audit_archive_checkpoints") as cursor:
        cursor.itersize = 16
        cursor.execute(QUERIES["archive_checkpoints"], {"low": min(needed), "high": max(needed)})
        for cp_id, created_at, prev, digest, key_id, signature, payload, heads in cursor:
            signed = verifies(public_key, signature, bytes.fromhex(digest))
            if cp_id in needed or run:
                checkpoint = {
                    "id": cp_id,
                    "created_at": created_at,
                    "prev_hash": prev,
                    "checkpoint_hash": digest,
                    "key_id": key_id,
                    "ed25519_signature": signature if signed else "",
                    "payload": payload,
                }
                if heads is not None:  # version 2: its payload commits to their root
                    checkpoint["heads"] = json.loads(heads) if isinstance(heads, str) else heads
                run.append(checkpoint)
            if signed:
                taken += run
                run = []
    return taken


def _entry_lines(heads: list[tuple[str, int, str, int]]) -> Iterator[bytes]:
    """Each entry as the canonical line {chain_hash, entry, prev_hash}, the entry being the
    exact payload that was hashed (refused when it is not canonical JSON)."""
    params = {"chains": [h[0] for h in heads], "heads": [h[1] for h in heads]}
    with connection.connection.cursor(name="audit_archive_entries") as cursor:
        cursor.itersize = BATCH_ROWS
        cursor.execute(QUERIES["archive_entries"], params)
        for row in cursor:
            yield entry_line(*row)


def entry_line(chain: str, seq: int, payload: str, prev: str, stored: str) -> bytes:
    """One stored entry as its archive line {chain_hash, entry, prev_hash}, the entry
    being the exact payload that was hashed (ArchiveError when it is not canonical JSON:
    an archive's reader could not recompute its hash)."""
    try:
        entry = json.loads(payload)
        canonical = canonical_bytes(entry) == payload.encode("utf-8")
    except ValueError:
        canonical = False
    if not canonical:
        raise ArchiveError(
            f"chain {chain} seq {seq}: the stored payload is not canonical JSON; "
            "run `manage.py verify_audit_chain`"
        )
    return canonical_bytes({"chain_hash": stored, "entry": entry, "prev_hash": prev})


def verify_archive(
    file: IO[bytes], *, public_key: str | Keyring | None = None
) -> VerificationReport:
    """Verify an archive from its bytes alone (no database); never raises for tampering.

    1. The header: canonical, of this format (else ArchiveUnreadable), its key the
       auditor's when one is given, its Ed25519 signature. With a keyring of several
       keys: the header's key id names a key of the keyring valid at its created_at, and
       each checkpoint's signature is verified under the key its own key id names.
    2. Each checkpoint: its hash recomputed from prev_hash and payload, and either its
       Ed25519 signature or its link to the authentic checkpoint after it.
    3. Each chain's head is named by the authentic checkpoint the header says.
    4. The entries, streamed: each line canonical, each chain from seq 1 in order, each
       hash recomputed, each chain ending at its head (`_Entries`).
    """
    started = time.perf_counter()
    report = VerificationReport()
    try:
        first = file.readline()
        header = json.loads(first)
        if not (
            isinstance(header, dict)
            and header.get("format") == FORMAT
            and header.get("version") == VERSION
        ):
            raise ValueError("not a jobops audit archive header")
        key = load_public_key(header["public_key"])
        checkpoints = list(header["checkpoints"])
        chains = [dict(c) for c in header["chains"]]
        if not all(isinstance(c.get("chain"), str) for c in chains):
            raise ValueError("a chain of the header has no name")
    except (OSError, EOFError, zlib.error, ValueError, KeyError, TypeError) as exc:
        raise ArchiveUnreadable(f"not a readable audit archive: {exc}") from exc
    keyring = public_key if isinstance(public_key, Keyring) and not public_key.single else None
    given = public_key.keys[0].text if isinstance(public_key, Keyring) and not keyring else None
    given = public_key if isinstance(public_key, str) else given
    unsigned = {k: v for k, v in header.items() if k != "signature"}
    if keyring is not None:
        # An archive written before keyrings names no key id: its key must be one of them.
        refused = keyring.check(
            key_id=header.get("key_id", keyring.key_id_of(header["public_key"])),
            signature=header.get("signature"),
            message=canonical_bytes(unsigned),
            at=header.get("created_at"),
            what="the archive's header signature",
        )
        if refused:
            report.add(Problem(kind="archive_key", message=refused))
            return report
    elif given is not None and given.strip() != header["public_key"]:
        report.add(
            Problem(
                kind="archive_key",
                message="the archive is signed by another key than the one given",
            )
        )
        return report
    if first.rstrip(b"\n") != canonical_bytes(header) or not verifies(
        key, header.get("signature"), canonical_bytes(unsigned)
    ):
        report.add(
            Problem(kind="archive_signature", message="the header's Ed25519 signature fails")
        )
    named = _authentic_heads(report, keyring or key, checkpoints)
    for chain in chains:
        head = (chain.get("chain"), chain.get("head_seq"), chain.get("head_hash"))
        try:
            signed = head in named.get(chain.get("checkpoint_id"), set())
        except TypeError:  # an id or head a JSON list or object: not a checkpoint's
            signed = False
        if not signed:
            report.add(
                _problem(
                    chain.get("chain"),
                    chain.get("head_seq"),
                    "head_unsigned",
                    "no authentic checkpoint names this head",
                )
            )
    _Entries(report, chains).walk(file)
    report.seconds = time.perf_counter() - started
    return report


def _authentic_heads(
    report: VerificationReport, key: Any, checkpoints: list[Any]
) -> dict[Any, set[tuple[Any, Any, Any]]]:
    """The heads each authentic checkpoint names, by checkpoint id (see verify_archive)."""
    named: dict[Any, set[tuple[Any, Any, Any]]] = {}
    refused: str | None = None
    successor: dict[str, Any] | None = None  # the next checkpoint, when authentic
    for checkpoint in reversed(checkpoints):
        report.checkpoints_checked += 1
        refused = None
        try:
            digest = checkpoint["checkpoint_hash"]
            hash_ok = chain_hash(checkpoint["prev_hash"], checkpoint["payload"].encode()) == digest
            if checkpoint["ed25519_signature"] and isinstance(key, Keyring):
                refused = key.check(
                    key_id=checkpoint["key_id"],
                    signature=checkpoint["ed25519_signature"],
                    message=bytes.fromhex(digest),
                    at=checkpoint["created_at"],
                    what="Ed25519 signature",
                )
                signed = refused is None
            elif checkpoint["ed25519_signature"]:
                signed = verifies(key, checkpoint["ed25519_signature"], bytes.fromhex(digest))
            else:
                signed = successor is not None and successor["prev_hash"] == digest
            heads = checkpoint_heads(checkpoint["payload"], checkpoint.get("heads"))
            found = set(heads)
            cp_id = int(checkpoint["id"])
        except (ValueError, KeyError, TypeError, AttributeError):
            hash_ok = signed = False
        if hash_ok and signed:
            named[cp_id] = found
            report.heads_checked += len(found)
            successor = checkpoint
        else:
            where = checkpoint.get("id") if isinstance(checkpoint, dict) else None
            report.add(
                Problem(
                    kind="checkpoint_broken",
                    message=refused or "its hash, Ed25519 signature or link to the next one fails",
                    checkpoint_id=where if isinstance(where, int) else None,
                )
            )
            successor = None
    return named


def _problem(chain: Any, seq: Any, kind: str, message: str) -> Problem:
    chain = str(chain)
    return Problem(
        kind=kind,
        message=message,
        chain=chain,
        job_id=chain[4:] if chain.startswith("job:") else None,
        seq=seq if isinstance(seq, int) else None,
    )


class _Entries:
    """Walks the entry lines against the header's chains, in order.

    The first problem of a chain is reported at the seq the archive should have had
    there (what a changed, removed or reordered line breaks); the rest of that chain is
    skipped. A line of a chain later in the list ends the current one (lines missing at
    its end, or chains missing whole, are reported); a line of no chain to come, or an
    unreadable one, counts as a changed line of the current chain.
    """

    def __init__(self, report: VerificationReport, chains: list[dict[str, Any]]) -> None:
        self.report = report
        self.chains = chains
        self.position = {c.get("chain"): i for i, c in enumerate(chains)}
        self.index = -1
        self.seq = 1
        self.prev = ""
        self.broken = True

    def walk(self, file: IO[bytes]) -> None:
        number = 1
        try:
            for line in file:
                number += 1
                self._line(number, line)
        except (OSError, EOFError, zlib.error) as exc:
            self._changed(f"line {number + 1} is unreadable: {exc}")
        self._advance(len(self.chains))

    @property
    def chain(self) -> dict[str, Any]:
        return self.chains[self.index] if 0 <= self.index < len(self.chains) else {}

    def _changed(self, message: str) -> None:
        if not self.broken:
            self.report.add(_problem(self.chain.get("chain"), self.seq, "line_broken", message))
            self.broken = True

    def _advance(self, index: int) -> None:
        """Close the current chain and move to the chain at `index` (reporting those
        between it and the current one as missing)."""
        if 0 <= self.index < len(self.chains) and not self.broken:
            head_seq, head_hash = self.chain.get("head_seq"), self.chain.get("head_hash")
            if self.seq - 1 != head_seq or self.prev != head_hash:
                self._changed(
                    f"the chain ends at seq {self.seq - 1}; its checkpoint names head seq "
                    f"{head_seq}: lines are missing"
                )
        for missing in self.chains[self.index + 1 : index]:
            self.report.add(
                _problem(missing.get("chain"), 1, "chain_missing", "no lines for this chain")
            )
        self.index, self.seq, self.prev, self.broken = index, 1, "0" * 64, False
        if index < len(self.chains):
            self.report.chains_checked += 1
            # A segment of a chain that goes on across partitions (the ops chain in a
            # partition's archive) starts after its first entry: where and from what hash.
            start, prev = self.chain.get("from_seq", 1), self.chain.get("from_hash", "0" * 64)
            if isinstance(start, int) and start >= 1 and isinstance(prev, str):
                self.seq, self.prev = start, prev

    def _line(self, number: int, line: bytes) -> None:
        self.report.rows_checked += 1
        try:
            record = json.loads(line)
            entry, prev, stored = record["entry"], record["prev_hash"], record["chain_hash"]
            chain, seq = entry["chain"], entry["seq"]
            readable = (
                len(record) == 3
                and isinstance(chain, str)
                and line == canonical_bytes(record) + b"\n"
            )
        except (ValueError, KeyError, TypeError):
            chain, seq, readable = None, None, False
        target = self.position.get(chain, -1) if readable else -1
        if target > self.index:
            self._advance(target)
        elif 0 <= target < self.index:
            self._changed(f"line {number} holds chain {chain} seq {seq}: out of order")
            return
        if self.index == -1:  # nothing readable yet: the first chain is where it breaks
            if not self.chains:
                message = f"line {number}: the header lists no chain"
                self.report.add(Problem(kind="line_broken", message=message))
                return
            self._advance(0)
        if not readable:
            self._changed(f"line {number} is not a canonical archive line")
            return
        if target != self.index:
            self._changed(f"line {number} holds chain {chain}, which the header does not list")
            return
        if self.broken:
            return
        try:
            computed = chain_hash(prev, canonical_bytes(entry))
        except (ValueError, TypeError):
            computed = None
        if seq != self.seq:
            self._changed(f"line {number}: expected seq {self.seq}, found {seq}")
        elif prev != self.prev:
            self._changed(f"line {number}: prev_hash does not match the previous chain_hash")
        elif computed != stored:
            self._changed(f"line {number}: chain_hash does not match sha256(prev_hash + entry)")
        else:
            self.seq, self.prev = self.seq + 1, stored
