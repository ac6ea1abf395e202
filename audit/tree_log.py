"""The checkpoint log as stored: signed tree heads (audit_tree_heads) and the proofs
computed from their nodes (audit.tree explains the layout and its cost)."""

from __future__ import annotations

import base64
from typing import Any

from audit.models import AuditCheckpoint, AuditTreeHead
from audit.services import format_ts
from audit.signing import public_key_text, sign
from audit.tree import StoredTree, checkpoint_leaf, public_key_id, tree_head_bytes


def _load(sizes: list[int]) -> dict[int, list[str]]:
    rows = AuditTreeHead.objects.filter(tree_size__in=sizes).values_list("tree_size", "nodes")
    return dict(rows)


def stored_tree() -> StoredTree:
    return StoredTree(_load)


def latest_tree_head() -> AuditTreeHead | None:
    return AuditTreeHead.objects.order_by("-tree_size").first()


def tree_head_append(checkpoint: AuditCheckpoint) -> AuditTreeHead:
    """Append `checkpoint` to the log and sign the new tree head; call it in the
    checkpoint's transaction, under the checkpoint barrier (which serialises writers;
    the unique tree_size backs that up)."""
    previous = latest_tree_head()
    size = previous.tree_size if previous else 0
    nodes, root = stored_tree().append(size, checkpoint_leaf(checkpoint.checkpoint_hash))
    key_id = public_key_id(public_key_text())
    created_at = checkpoint.created_at
    message = tree_head_bytes(
        tree_size=size + 1, root_hash=root.hex(), created_at=format_ts(created_at), key_id=key_id
    )
    return AuditTreeHead.objects.create(
        tree_size=size + 1,
        checkpoint_id=checkpoint.pk,
        checkpoint_hash=checkpoint.checkpoint_hash,
        root_hash=root.hex(),
        created_at=created_at,
        key_id=key_id,
        signature=sign(message),
        nodes=nodes,
    )


def encode_path(hashes: list[bytes]) -> list[str]:
    """An audit path as proofs carry it: base64, as RFC 6962's JSON API has it (a third
    shorter than hex: a year's proof stays under 8 KB)."""
    return [base64.b64encode(h).decode("ascii") for h in hashes]


def tree_head_document(head: AuditTreeHead) -> dict[str, Any]:
    """A signed tree head as proofs carry it: what its signature signs, and the signature."""
    return {
        "tree_size": head.tree_size,
        "root_hash": head.root_hash,
        "created_at": format_ts(head.created_at),
        "key_id": head.key_id,
        "signature": head.signature,
    }


class TreeHeadNotFound(LookupError):
    """No tree head of that size (yet)."""


def consistency_document(first: int, second: int) -> dict[str, Any]:
    """The consistency proof between the signed tree heads of sizes `first` < `second`
    (verified by audit.proofs.verify_consistency_document)."""
    heads = {h.tree_size: h for h in AuditTreeHead.objects.filter(tree_size__in=[first, second])}
    for size in (first, second):
        if size not in heads:
            raise TreeHeadNotFound(size)
    return {
        "format": "jobops-audit-consistency",
        "version": 1,
        "first": tree_head_document(heads[first]),
        "second": tree_head_document(heads[second]),
        "path": encode_path(stored_tree().consistency(first, second)),
    }
