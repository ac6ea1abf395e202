"""The checkpoint log checked by `verify_audit_chain` (docs/architecture.md#the-checkpoint-log).

Streams the tree heads in order and recomputes the log from the checkpoint hashes alone:
each tree head must name an existing checkpoint by its hash, in checkpoint order (one
that is not genuine is reported as checkpoint_broken, not again here), store exactly the
nodes its leaf completes (proofs are computed from them) and the root they give, and
carry a valid Ed25519 signature when signed by the current key; every version 2
checkpoint must be a leaf. Memory: the right frontier of the tree (log2 n hashes).
"""

from __future__ import annotations

from typing import Any

from django.db import connection

from audit.merkle import node_hash
from audit.queries import QUERIES
from audit.signing import load_public_key, public_key_text, verifies
from audit.tree import checkpoint_leaf, fold, public_key_id, tree_head_bytes

# (kind, message, checkpoint id)
Finding = tuple[str, str, int | None]


def check_tree_heads(genuine: list[int], *, limit: int) -> tuple[int, list[Finding]]:
    """(tree heads checked, what is wrong, at most `limit`)."""
    found: list[Finding] = []
    key_text = public_key_text()
    key, key_id = load_public_key(key_text), public_key_id(key_text)
    authentic = set(genuine)
    frontier: list[bytes] = []
    size = last_checkpoint = 0
    with connection.connection.cursor(name="audit_verify_tree_heads") as cursor:
        cursor.itersize = 2_000
        cursor.execute(QUERIES["verify_tree_heads"])
        for row in cursor:
            size += 1
            problem = _check(row, size, last_checkpoint, authentic, frontier, key, key_id)
            if problem and len(found) < limit:
                found.append((*problem, row[1]))
            last_checkpoint = row[1]
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["checkpoints_outside_log"], {"genuine": genuine, "limit": limit})
        for (cp_id,) in cursor.fetchall():
            if len(found) < limit:
                message = "a version 2 checkpoint that no tree head puts in the log"
                found.append(("checkpoint_not_in_log", message, cp_id))
    return size, found


def _check(
    row: tuple[Any, ...],
    size: int,
    last_checkpoint: int,
    authentic: set[int],
    frontier: list[bytes],
    key: Any,
    key_id: str,
) -> tuple[str, str] | None:
    """Advance `frontier` by this tree head's leaf and say what is wrong with it."""
    tree_size, cp_id, named_hash, actual_hash, root, created_at, head_key, signature, nodes = row
    try:
        leaf = checkpoint_leaf(named_hash)  # what the log was built from
    except ValueError:
        leaf = bytes(32)
    created, index = [leaf], size - 1
    while index & 1:
        created.append(node_hash(frontier.pop(), created[-1]))
        index >>= 1
    frontier.append(created[-1])
    if tree_size != size:
        return ("tree_head_broken", f"tree size {tree_size} where {size} was due: heads missing")
    if actual_hash is None:
        return ("tree_head_broken", f"tree head {size} names checkpoint {cp_id}, which is missing")
    # A checkpoint that is not genuine is reported as checkpoint_broken already.
    if cp_id in authentic and named_hash != actual_hash:
        return ("tree_head_broken", f"tree head {size} names another hash of checkpoint {cp_id}")
    if cp_id <= last_checkpoint:
        return ("tree_head_broken", f"tree head {size} puts checkpoint {cp_id} out of order")
    if list(nodes) != [h.hex() for h in created] or root != fold(frontier).hex():
        return ("tree_head_broken", f"tree head {size}: its nodes or root do not match the log")
    message = tree_head_bytes(
        tree_size=tree_size, root_hash=root, created_at=created_at, key_id=head_key
    )
    if head_key == key_id and not verifies(key, signature, message):
        return ("tree_head_broken", f"tree head {size}: its Ed25519 signature fails")
    return None
