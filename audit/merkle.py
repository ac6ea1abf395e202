"""RFC 9162 (Certificate Transparency 2.0) Merkle trees: hashes, inclusion and
consistency proofs, and their verification (docs/architecture.md#the-checkpoint-log).

Written here rather than taken from a package: of the Python packages on PyPI none both
generates and verifies RFC 9162 proofs in the RFC's own format (an audit path of sibling
hashes, verified by the algorithms of sections 2.1.3.2 and 2.1.4.2) while letting the
caller supply subtree hashes from its own storage. pymerkle has its own proof format
(rule and subset bits) and keeps the leaves itself; sigstore only verifies inclusion,
through an internal module. The whole of it is a hundred lines, checked against the test
vectors of Google's transparency-dev/merkle (tests/audit/test_merkle.py), and an auditor
can read it in one sitting.

Generation works on any `mth(start, end)` that returns the tree hash of leaves
[start, end): in memory (`MemoryTree`) or from the stored subtree roots of the checkpoint
log (audit.tree). Every range the RFC's recursion asks for starts at a multiple of a
power of two at least as large as the range, so it is a run of complete subtrees.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()

RangeHash = Callable[[int, int], bytes]


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def split(n: int) -> int:
    """The largest power of two smaller than n (n >= 2): where RFC 9162 splits D[n]."""
    return 1 << ((n - 1).bit_length() - 1)


def inclusion_path(index: int, size: int, mth: RangeHash) -> list[bytes]:
    """PATH(m, D[n]) of RFC 9162 section 2.1.3.1, leaf first, for leaf `index` < `size`."""
    if not 0 <= index < size:
        raise ValueError(f"leaf {index} is not in a tree of {size}")
    path: list[bytes] = []
    start, end = 0, size
    while end - start > 1:
        k = split(end - start)
        if index - start < k:
            path.append(mth(start + k, end))
            end = start + k
        else:
            path.append(mth(start, start + k))
            start += k
    path.reverse()
    return path


def consistency_path(first: int, second: int, mth: RangeHash) -> list[bytes]:
    """PROOF(m, D[n]) of RFC 9162 section 2.1.4.1 for 0 < first <= second."""
    if not 0 < first <= second:
        raise ValueError(f"no consistency proof from {first} to {second}")
    path: list[bytes] = []
    start, end, whole = 0, second, True  # SUBPROOF(m, D[start:end], whole)
    m = first
    while True:
        n = end - start
        if m == n:
            if not whole:
                path.append(mth(start, end))
            break
        k = split(n)
        if m <= k:
            path.append(mth(start + k, end))
            end = start + k
        else:
            path.append(mth(start, start + k))
            start, m, whole = start + k, m - k, False
    path.reverse()
    return path


def verify_inclusion(
    index: int, size: int, leaf: bytes, path: Sequence[bytes], root: bytes
) -> bool:
    """RFC 9162 section 2.1.3.2: whether `path` proves leaf hash `leaf` at `index`."""
    if not 0 <= index < size or not _hashes(path):
        return False
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == root


def verify_consistency(
    first: int, second: int, first_root: bytes, second_root: bytes, path: Sequence[bytes]
) -> bool:
    """RFC 9162 section 2.1.4.2: whether `path` proves the tree of `second` leaves with
    `second_root` extends the one of `first` leaves with `first_root`."""
    if not 0 <= first <= second or not _hashes(path):
        return False
    if first == second:
        return not path and first_root == second_root
    if first == 0:
        return not path  # every tree extends the empty one
    if not path:
        return False
    proof = list(path)
    if first & (first - 1) == 0:  # a power of two: first_root is the first node
        proof.insert(0, first_root)
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = proof[0]
    for c in proof[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and fr == first_root and sr == second_root


def _hashes(path: Sequence[bytes]) -> bool:
    return all(isinstance(p, bytes) and len(p) == HASH_SIZE for p in path)


class MemoryTree:
    """A tree over leaf data held in memory (a checkpoint's heads, tests)."""

    def __init__(self, leaves: Sequence[bytes]) -> None:
        self.hashes = [leaf_hash(d) for d in leaves]

    def mth(self, start: int, end: int) -> bytes:
        """MTH(D[start:end]) (RFC 9162 section 2.1.1)."""
        n = end - start
        if n == 0:
            return EMPTY_ROOT
        if n == 1:
            return self.hashes[start]
        k = split(n)
        return node_hash(self.mth(start, start + k), self.mth(start + k, end))

    @property
    def root(self) -> bytes:
        return self.mth(0, len(self.hashes))

    def inclusion(self, index: int) -> list[bytes]:
        return inclusion_path(index, len(self.hashes), self.mth)

    def consistency(self, first: int, second: int) -> list[bytes]:
        return consistency_path(first, second, self.mth)
