"""Checkpoint heads as a Merkle tree; the checkpoint log (docs/architecture.md#the-checkpoint-log).

Two levels, both RFC 9162 trees (audit.merkle):

1. A version 2 checkpoint commits to the heads it records through `heads_root`, the tree
   over their canonical bytes (`head_leaf`), leaves in byte order of the chain name. The
   heads themselves live beside the payload (the `heads` column), unhashed: every
   reader checks them against the root. A proof of one head then shows no other chain.
2. The checkpoints form an append-only log: leaf i is the hash (32 bytes) of the i-th
   version 2 checkpoint, and each checkpoint is followed, in its transaction, by a tree
   head (size, root) signed with Ed25519 (`AuditTreeHead`).

Cost: appending leaf i creates the nodes that leaf completes, the leaf hash and one
node per trailing 1 bit of i (two on average); they are stored on the leaf's tree head
(`nodes`, level 0 first). Node (level l, index k) is therefore element l of the tree head
of size (k + 1) * 2**l. A new root needs the roots of the complete subtrees the previous
size splits into (at most log2 n rows), and a proof the O(log n) nodes on its path: no
leaf is ever read again, however many checkpoints there are.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from audit.canonical import canonical_bytes
from audit.merkle import EMPTY_ROOT, MemoryTree, consistency_path, inclusion_path, leaf_hash
from audit.merkle import node_hash as _node

TREE_HEAD_FORMAT = "jobops-audit-tree-head"
CHECKPOINT_V2 = 2


class HeadsMismatch(ValueError):
    """A version 2 checkpoint's stored heads do not hash to the root its payload signs."""


def head_leaf(chain: str, seq: int, chain_hash: str) -> bytes:
    """The canonical bytes of a head: the leaf data of a checkpoint's heads tree."""
    return canonical_bytes({"chain": chain, "chain_hash": chain_hash, "seq": seq})


def canonical_heads(rows: Iterable[tuple[str, int, str]]) -> list[dict[str, Any]]:
    """Heads as a version 2 checkpoint stores them, in byte order of the chain name."""
    ordered = sorted(rows, key=lambda r: r[0].encode("utf-8"))
    return [{"chain": c, "chain_hash": h, "seq": s} for c, s, h in ordered]


def heads_tree(heads: list[dict[str, Any]]) -> MemoryTree:
    return MemoryTree([head_leaf(h["chain"], h["seq"], h["chain_hash"]) for h in heads])


def checkpoint_payload_v2(
    *,
    created_at: str,
    last_audit_id: int,
    prev_hash: str,
    key_id: str,
    heads: list[dict[str, Any]],
) -> bytes:
    """What a version 2 checkpoint hashes: no chain name, the heads through their root."""
    return canonical_bytes(
        {
            "v": CHECKPOINT_V2,
            "created_at": created_at,
            "last_audit_id": last_audit_id,
            "prev_hash": prev_hash,
            "key_id": key_id,
            "heads_count": len(heads),
            "heads_root": heads_tree(heads).root.hex(),
        }
    )


def is_v2(payload: bytes | str) -> bool:
    """Whether a stored checkpoint payload is version 2 (JCS puts `v` last)."""
    tail = payload[-7:] if isinstance(payload, bytes) else payload[-7:].encode()
    return tail == b',"v":2}'


def checkpoint_heads(payload: str, heads: Any) -> list[tuple[Any, Any, Any]]:
    """The (chain, seq, hash) heads a checkpoint records, whichever its version.

    Version 1 holds them in its payload; version 2 in `heads`, checked against the
    payload's heads_root and heads_count (HeadsMismatch when they disagree)."""
    document = _loads(payload)
    if document.get("v") != CHECKPOINT_V2:
        return [(h["chain"], h["seq"], h["hash"]) for h in document["heads"]]
    heads = _as_list(heads)  # jsonb from a raw cursor: Django's psycopg loads it as text
    if not isinstance(heads, list) or not all(isinstance(h, dict) for h in heads):
        raise HeadsMismatch("the checkpoint's heads are missing")
    try:
        root = heads_tree(heads).root.hex()
        ordered = [h["chain"].encode("utf-8") for h in heads]
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise HeadsMismatch(f"a head is malformed: {exc}") from exc
    if ordered != sorted(set(ordered)):
        raise HeadsMismatch("the heads are not in byte order of their chain, each once")
    if root != document.get("heads_root") or len(heads) != document.get("heads_count"):
        raise HeadsMismatch("the stored heads do not hash to the signed heads_root")
    return [(h["chain"], h["seq"], h["chain_hash"]) for h in heads]


def _as_list(heads: Any) -> Any:
    return json.loads(heads) if isinstance(heads, str | bytes) else heads


def _loads(payload: str) -> dict[str, Any]:
    document = json.loads(payload)
    if not isinstance(document, dict):
        raise ValueError("a checkpoint payload is a JSON object")
    return document


def v2_payload_problem(
    payload: bytes,
    *,
    heads: Any,
    created_at: str,
    last_audit_id: int,
    prev_hash: str,
    key_id: str,
) -> str | None:
    """What is wrong with a version 2 checkpoint whose hash verified (None: nothing):
    its columns must agree with the signed payload, its heads with heads_root."""
    try:
        heads = _as_list(heads)
        checkpoint_heads(payload.decode("utf-8"), heads)
    except HeadsMismatch as exc:
        return str(exc)
    except (ValueError, KeyError, TypeError) as exc:
        return f"payload is not a version 2 checkpoint: {exc}"
    expected = checkpoint_payload_v2(
        created_at=created_at,
        last_audit_id=last_audit_id,
        prev_hash=prev_hash,
        key_id=key_id,
        heads=heads,
    )
    if payload != expected:
        return "columns disagree with the signed payload"
    return None


def tree_head_bytes(*, tree_size: int, root_hash: str, created_at: str, key_id: str) -> bytes:
    """What a tree head's Ed25519 signature signs."""
    return canonical_bytes(
        {
            "format": TREE_HEAD_FORMAT,
            "v": 1,
            "tree_size": tree_size,
            "root_hash": root_hash,
            "created_at": created_at,
            "key_id": key_id,
        }
    )


def public_key_id(public_key_text: str) -> str:
    """The id of an Ed25519 public key, from the key alone: anyone holding the key can
    tell which of their keys a tree head names."""
    digest = hashlib.sha256(public_key_text.strip().encode("ascii")).hexdigest()
    return f"ed25519:{digest[:16]}"


def checkpoint_leaf(checkpoint_hash: str) -> bytes:
    """The leaf hash of a checkpoint in the checkpoint log."""
    return leaf_hash(bytes.fromhex(checkpoint_hash))


# -- The stored tree ----------------------------------------------------------------


def subtrees(start: int, end: int) -> list[tuple[int, int]]:
    """The complete subtrees (level, index) that [start, end) splits into, largest first.
    `start` must be a multiple of a power of two at least end - start (every range the
    RFC's recursion asks for is)."""
    pieces: list[tuple[int, int]] = []
    size = end - start
    for level in range(size.bit_length() - 1, -1, -1):
        if size >> level & 1:
            pieces.append((level, start >> level))
            start += 1 << level
    return pieces


def fold(hashes: list[bytes]) -> bytes:
    """MTH of consecutive complete subtrees, largest first: RFC 9162 splits a range at its
    largest power of two, so the tree leans right."""
    if not hashes:
        return EMPTY_ROOT
    root = hashes[-1]
    for h in reversed(hashes[:-1]):
        root = _node(h, root)
    return root


def node_owner(level: int, index: int) -> int:
    """The tree size whose tree head stores node (level, index)."""
    return (index + 1) << level


class StoredTree:
    """The checkpoint log as its tree heads store it: ranges of leaves hashed from the
    stored nodes. `load(sizes)` returns {tree_size: nodes} for the given tree sizes.

    A path is computed twice: once to learn which nodes it needs, once with them (one
    query for all)."""

    def __init__(self, load: Any) -> None:
        self.load = load
        self.nodes: dict[tuple[int, int], bytes] = {}

    def _fetch(self, keys: set[tuple[int, int]]) -> None:
        missing = {k for k in keys if k not in self.nodes}
        if not missing:
            return
        rows = self.load(sorted({node_owner(*k) for k in missing}))
        for level, index in missing:
            stored = rows.get(node_owner(level, index))
            if stored is None or len(stored) <= level:
                raise LookupError(f"the checkpoint log lacks node {level}/{index}")
            self.nodes[(level, index)] = bytes.fromhex(stored[level])

    def _run(self, compute: Any) -> Any:
        wanted: set[tuple[int, int]] = set()

        def record(start: int, end: int) -> bytes:
            wanted.update(subtrees(start, end))
            return EMPTY_ROOT

        compute(record)
        self._fetch(wanted)
        return compute(self.mth)

    def mth(self, start: int, end: int) -> bytes:
        return fold([self.nodes[k] for k in subtrees(start, end)])

    def root(self, size: int) -> bytes:
        return self._run(lambda mth: mth(0, size))  # type: ignore[no-any-return]

    def inclusion(self, index: int, size: int) -> list[bytes]:
        return self._run(lambda mth: inclusion_path(index, size, mth))  # type: ignore[no-any-return]

    def consistency(self, first: int, second: int) -> list[bytes]:
        return self._run(lambda mth: consistency_path(first, second, mth))  # type: ignore[no-any-return]

    def append(self, size: int, leaf: bytes) -> tuple[list[str], bytes]:
        """The nodes the leaf hash `leaf` completes as leaf `size` (level 0 first) and the
        root of size + 1."""
        frontier = subtrees(0, size)
        self._fetch(set(frontier))
        hashes = [self.nodes[k] for k in frontier]
        created = [leaf]
        index = size
        while index & 1:
            created.append(_node(hashes.pop(), created[-1]))
            index >>= 1
        return [h.hex() for h in created], fold([*hashes, created[-1]])
