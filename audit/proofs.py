"""A proof of one job's audit history, and consistency proofs between tree heads
(docs/security.md#a-proof-per-job).

A job's proof holds its chain's entries (as archive lines), the chain's head, the
inclusion of that head in the version 2 checkpoint that recorded it (the checkpoint's
payload names no chain: it commits to its heads through their Merkle root), the
inclusion of that checkpoint in the newest signed tree head of the checkpoint log, and
that tree head. `verify_job_proof` checks all of it with the Ed25519 public key alone: no
database, no secret, nothing of another chain.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
import uuid
from typing import Any

from django.conf import settings
from django.db import connection

from audit.canonical import GENESIS_HASH, canonical_bytes, chain_hash
from audit.errors import AuditProofPendingError
from audit.keyring import Keyring, KeyringError, as_time, load_keyring
from audit.merkle import leaf_hash, verify_consistency, verify_inclusion
from audit.models import AuditTreeHead
from audit.queries import QUERIES
from audit.report import Problem, VerificationReport
from audit.services import job_chain
from audit.signing import public_key_text, verifies
from audit.tree import (
    CHECKPOINT_V2,
    checkpoint_heads,
    checkpoint_leaf,
    head_leaf,
    heads_tree,
    public_key_id,
    tree_head_bytes,
)
from audit.tree_log import encode_path, latest_tree_head, stored_tree, tree_head_document

PROOF_FORMAT = "jobops-audit-proof"
CONSISTENCY_FORMAT = "jobops-audit-consistency"
VERSION = 1
# A proof file is small (about 5 KB for ten entries); refuse to parse anything huge.
MAX_PROOF_BYTES = 16 * 1024 * 1024


class ProofUnreadable(Exception):
    """Not a proof of this format at all (exit status 2)."""


class ChainNotFound(LookupError):
    """The job has no audit entry (no such job, or its entries left the database)."""


def job_proof(job_id: uuid.UUID | str) -> dict[str, Any]:
    """The proof of the job's chain up to its current head (see the module docstring).

    ChainNotFound without entries; AuditProofPendingError while no version 2
    checkpoint names the current head (the next checkpoint will)."""
    chain = job_chain(job_id)
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["proof_entries"], {"chain": chain})
        rows = cursor.fetchall()
    if not rows:
        raise ChainNotFound(chain)
    seq, head_hash = rows[-1][0], rows[-1][3]
    head = {"chain": chain, "chain_hash": head_hash, "seq": seq}
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["proof_checkpoint"], {"head": json.dumps([head])})
        found = cursor.fetchone()
    tree_head = latest_tree_head()
    if found is None or tree_head is None:
        raise AuditProofPendingError(retry_after=settings.AUDIT_CHECKPOINT_SECONDS)
    cp_id, payload, signature, heads, leaf = found
    heads = checkpoint_heads(payload, heads)
    index = next(i for i, h in enumerate(heads) if h[0] == chain)
    tree = heads_tree([{"chain": c, "seq": s, "chain_hash": h} for c, s, h in heads])
    return {
        "format": PROOF_FORMAT,
        "version": VERSION,
        "key_id": tree_head.key_id,
        "job_id": str(job_id),
        "entries": [_line(chain, *row) for row in rows],
        "head": head,
        # Its hash is sha256(prev_hash + payload), prev_hash being in the payload; its
        # HMAC is left out: only the operator's secret verifies it.
        "checkpoint": {
            "id": cp_id,
            "payload": payload,
            "ed25519_signature": signature,
            "leaf_index": index,
            "tree_size": len(heads),
            "path": encode_path(tree.inclusion(index)),
        },
        "log": {
            "leaf_index": leaf - 1,
            "tree_size": tree_head.tree_size,
            "path": encode_path(stored_tree().inclusion(leaf - 1, tree_head.tree_size)),
        },
        "tree_head": tree_head_document(tree_head),
    }


def _line(chain: str, seq: int, payload: str, prev: str, stored: str) -> dict[str, Any]:
    entry = json.loads(payload)
    if canonical_bytes(entry) != payload.encode("utf-8"):
        raise ValueError(
            f"chain {chain} seq {seq}: the stored payload is not canonical JSON; "
            "run `manage.py verify_audit_chain`"
        )
    return {"chain_hash": stored, "entry": entry, "prev_hash": prev}


def tree_head_for(size: int) -> AuditTreeHead | None:
    return AuditTreeHead.objects.filter(tree_size=size).first()


# -- Offline verification: the document and a public key, nothing else ---------------


def load_document(data: bytes, expected_format: str) -> dict[str, Any]:
    """A proof or consistency document from its bytes; ProofUnreadable when it is not."""
    if len(data) > MAX_PROOF_BYTES:
        raise ProofUnreadable(f"larger than {MAX_PROOF_BYTES} bytes")
    try:
        document = json.loads(data)
    except ValueError as exc:
        raise ProofUnreadable(f"not JSON: {exc}") from exc
    if not (
        isinstance(document, dict)
        and document.get("format") == expected_format
        and document.get("version") == VERSION
    ):
        raise ProofUnreadable(f"not a {expected_format} document of version {VERSION}")
    return document


def _hashes(values: Any) -> list[bytes]:
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise TypeError("a path is a list of base64 hashes")
    try:
        return [base64.b64decode(v, validate=True) for v in values]
    except binascii.Error as exc:
        raise ValueError(f"a path holds something other than base64: {exc}") from exc


def _tree_head_problem(tree_head: Any, keyring: Keyring, what: str) -> Problem | None:
    """Whether `tree_head` is signed by the key its key id names (None: it is). A tree
    head's key id is the key's fingerprint (audit.tree.public_key_id), so the key is
    found in a keyring by the key alone; with a keyring, the tree head must also fall
    inside that key's validity."""
    try:
        message = tree_head_bytes(
            tree_size=tree_head["tree_size"],
            root_hash=tree_head["root_hash"],
            created_at=tree_head["created_at"],
            key_id=tree_head["key_id"],
        )
        named = tree_head["key_id"]
        signature = tree_head["signature"]
    except (KeyError, TypeError, ValueError):
        return Problem(kind="tree_head_broken", message=f"{what} is malformed")
    keys = [k for k in keyring.keys if public_key_id(k.text) == named]
    if not keys:
        given = ", ".join(public_key_id(k.text) for k in keyring.keys)
        return Problem(
            kind="proof_key",
            message=f"{what} names key {named!r}; the key(s) given are {given}",
        )
    signed_by = [k for k in keys if verifies(k.public_key, signature, message)]
    if not signed_by:
        return Problem(kind="tree_head_signature", message=f"{what}'s Ed25519 signature fails")
    if not keyring.single and not any(
        k.valid_at(as_time(tree_head["created_at"])) for k in signed_by
    ):
        return Problem(
            kind="proof_key",
            message=f"{what} was signed at {tree_head['created_at']}, outside the validity "
            f"of key {named!r} {signed_by[0].window()}",
        )
    return None


def proof_keyring(public_key: str | Keyring) -> Keyring:
    """The keys a proof is verified with: one key's text, a keyring file, or a keyring;
    ValueError when `public_key` is none of them."""
    if isinstance(public_key, Keyring):
        return public_key
    try:
        return load_keyring(public_key.strip())
    except KeyringError as exc:
        raise ValueError(str(exc)) from exc


def verify_job_proof(document: dict[str, Any], *, public_key: str | Keyring) -> VerificationReport:
    """Verify a job's proof with the public key alone; never raises for tampering.

    1. The tree head is signed by `public_key` (a key or a keyring: the key its key id
       names).
    2. The checkpoint's hash, sha256(prev_hash + payload) with the prev_hash its payload
       names, is in that tree head (RFC 9162 inclusion).
    3. The checkpoint's payload is canonical, version 2, and its Ed25519 signature
       verifies.
    4. The head is in the checkpoint's heads tree (RFC 9162 inclusion under heads_root).
    5. The entries form the chain from seq 1 to that head.
    """
    started = time.perf_counter()
    report = VerificationReport()
    keyring = proof_keyring(public_key)
    tree_head = document.get("tree_head")
    problem = _tree_head_problem(tree_head, keyring, "the tree head")
    if problem is not None:
        report.add(problem)
        report.seconds = time.perf_counter() - started
        return report  # nothing else counts unless the tree head is the key holder's
    checkpoint = document.get("checkpoint")
    head = document.get("head")
    try:
        assert isinstance(tree_head, dict) and isinstance(checkpoint, dict)
        log = document["log"]
        digest = chain_hash(
            json.loads(checkpoint["payload"])["prev_hash"], checkpoint["payload"].encode()
        )
        in_log = (
            verify_inclusion(
                log["leaf_index"],
                log["tree_size"],
                checkpoint_leaf(digest),
                _hashes(log["path"]),
                bytes.fromhex(tree_head["root_hash"]),
            )
            and log["tree_size"] == tree_head["tree_size"]
        )
    except (AssertionError, KeyError, TypeError, ValueError, AttributeError):
        in_log = False
    report.checkpoints_checked += 1
    if not in_log:
        report.add(
            Problem(
                kind="checkpoint_not_in_log",
                message="the checkpoint's inclusion in the signed tree head fails",
            )
        )
    cp_problem = _checkpoint_problem(checkpoint, keyring)
    if cp_problem:
        report.add(Problem(kind="checkpoint_broken", message=cp_problem))
    try:
        assert isinstance(head, dict) and isinstance(checkpoint, dict)
        signed = json.loads(checkpoint["payload"])
        in_checkpoint = checkpoint["tree_size"] == signed["heads_count"] and verify_inclusion(
            checkpoint["leaf_index"],
            checkpoint["tree_size"],
            leaf_hash(head_leaf(head["chain"], head["seq"], head["chain_hash"])),
            _hashes(checkpoint["path"]),
            bytes.fromhex(signed["heads_root"]),
        )
    except (AssertionError, KeyError, TypeError, ValueError):
        in_checkpoint = False
    report.heads_checked += 1
    if not in_checkpoint:
        report.add(
            Problem(
                kind="head_not_in_checkpoint",
                message="the head's inclusion in the checkpoint's heads_root fails",
            )
        )
    _check_entries(report, document.get("entries"), head, document.get("job_id"))
    report.seconds = time.perf_counter() - started
    return report


def _checkpoint_problem(checkpoint: Any, keyring: Keyring) -> str | None:
    """What is wrong with the proof's checkpoint (None: nothing). It may be older than
    the tree head and signed by an earlier key: the key its key_id names, valid at its
    created_at (audit.keyring)."""
    try:
        payload = checkpoint["payload"]
        signed = json.loads(payload)
        if signed.get("v") != CHECKPOINT_V2:
            return "its payload is not a version 2 checkpoint payload"
        digest = chain_hash(signed["prev_hash"], payload.encode("utf-8"))
        if canonical_bytes(signed) != payload.encode("utf-8"):
            return "its payload is not canonical JSON"
        problem = keyring.check(
            key_id=signed["key_id"],
            signature=checkpoint["ed25519_signature"],
            message=bytes.fromhex(digest),
            at=signed["created_at"],
            what="its Ed25519 signature",
        )
        if problem:
            return problem
    except (KeyError, TypeError, ValueError, AttributeError):
        return "it is malformed"
    return None


def _check_entries(report: VerificationReport, entries: Any, head: Any, job_id: Any) -> None:
    """The entries from seq 1 (genesis) to the head, each hash recomputed; the first
    break is reported at its seq."""
    chain = head.get("chain") if isinstance(head, dict) else None
    job = chain[4:] if isinstance(chain, str) and chain.startswith("job:") else None
    if not isinstance(chain, str) or job is None or job != job_id:
        report.add(
            Problem(kind="proof_broken", message="the head is not the chain of the proof's job")
        )
        return
    if not isinstance(entries, list):
        entries = []
    expected_seq, expected_prev = 1, GENESIS_HASH
    for line in entries:
        report.rows_checked += 1
        why = _entry_problem(line, chain, job, expected_seq, expected_prev)
        if why:
            report.add(
                Problem(kind="entry_broken", message=why, chain=chain, job_id=job, seq=expected_seq)
            )
            return
        expected_seq, expected_prev = expected_seq + 1, line["chain_hash"]
    report.chains_checked += 1
    if expected_seq - 1 != head.get("seq") or expected_prev != head.get("chain_hash"):
        report.add(
            Problem(
                kind="entries_missing",
                message=(
                    f"the entries end at seq {expected_seq - 1}; the signed head is seq "
                    f"{head.get('seq')}"
                ),
                chain=chain,
                job_id=job,
            )
        )


def _entry_problem(line: Any, chain: str, job: str, seq: int, prev: str) -> str | None:
    try:
        entry, line_prev, stored = line["entry"], line["prev_hash"], line["chain_hash"]
        if entry["chain"] != chain or entry["job_id"] != job:
            return "the entry belongs to another chain"
        if entry["seq"] != seq:
            return f"expected seq {seq}, found {entry['seq']}"
        if line_prev != prev:
            return "prev_hash does not match the previous entry's chain_hash"
        if chain_hash(line_prev, canonical_bytes(entry)) != stored:
            return "chain_hash does not match sha256(prev_hash + entry)"
    except (KeyError, TypeError, ValueError):
        return "the entry is malformed"
    return None


def verify_consistency_document(
    document: dict[str, Any], *, public_key: str | Keyring
) -> VerificationReport:
    """Verify that the second signed tree head extends the first (RFC 9162 consistency),
    both signed by `public_key`; never raises for tampering."""
    started = time.perf_counter()
    report = VerificationReport()
    keyring = proof_keyring(public_key)
    first, second = document.get("first"), document.get("second")
    for what, tree_head in (("the first tree head", first), ("the second tree head", second)):
        problem = _tree_head_problem(tree_head, keyring, what)
        if problem is not None:
            report.add(problem)
    if not report.ok:
        report.seconds = time.perf_counter() - started
        return report
    try:
        assert isinstance(first, dict) and isinstance(second, dict)
        consistent = verify_consistency(
            first["tree_size"],
            second["tree_size"],
            bytes.fromhex(first["root_hash"]),
            bytes.fromhex(second["root_hash"]),
            _hashes(document.get("path")),
        )
    except (AssertionError, KeyError, TypeError, ValueError):
        consistent = False
    report.checkpoints_checked += 2
    if not consistent:
        report.add(
            Problem(
                kind="consistency_broken",
                message="the second tree head does not extend the first: the log was rewritten",
            )
        )
    report.seconds = time.perf_counter() - started
    return report


def current_key_id() -> str:
    return public_key_id(public_key_text())
