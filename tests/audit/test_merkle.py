"""audit.merkle against the RFC 6962/9162 test vectors of transparency-dev/merkle
(proof/verify_test.go, Apache-2.0: leaves, roots, inclusion and consistency proofs of
trees of up to 8 leaves) and by properties: every proof of every tree up to 64 leaves
verifies, and a flipped bit anywhere fails it."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.merkle import (
    EMPTY_ROOT,
    MemoryTree,
    leaf_hash,
    verify_consistency,
    verify_inclusion,
)
from audit.tree import StoredTree

LEAVES = [bytes.fromhex(h) for h in (
    "", "00", "10", "2021", "3031", "40414243", "5051525354555657",
    "606162636465666768696a6b6c6d6e6f",
)]  # fmt: skip
ROOTS = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
# (leaf number from 1, tree size, path)
INCLUSION = [
    (1, 1, []),
    (1, 8, ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"]),
    (6, 8, ["bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]),
    (3, 3, ["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"]),
    (2, 5, ["6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"]),
]  # fmt: skip
CONSISTENCY = [
    (1, 1, []),
    (1, 8, ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"]),
    (6, 8, ["0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]),
    (2, 5, ["5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"]),
    (6, 7, ["0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]),
]  # fmt: skip

TREE = MemoryTree(LEAVES)


def test_roots_of_the_vectors():
    assert [TREE.mth(0, n).hex() for n in range(1, 9)] == ROOTS
    assert TREE.mth(0, 0) == EMPTY_ROOT == hashlib.sha256(b"").digest()


@pytest.mark.parametrize(("leaf", "size", "path"), INCLUSION)
def test_inclusion_vectors_generated_and_verified(leaf, size, path):
    root = bytes.fromhex(ROOTS[size - 1])
    proof = MemoryTree(LEAVES[:size]).inclusion(leaf - 1)
    assert [p.hex() for p in proof] == path
    assert verify_inclusion(leaf - 1, size, leaf_hash(LEAVES[leaf - 1]), proof, root)
    # The probes of the reference tests: a wrong index, size, leaf or root, extra or
    # missing hashes all fail.
    wrong = [
        (leaf - 2, size, leaf_hash(LEAVES[leaf - 1]), proof, root),
        (leaf, size, leaf_hash(LEAVES[leaf - 1]), proof, root),
        (leaf - 1, size * 2, leaf_hash(LEAVES[leaf - 1]), proof, root),
        (leaf - 1, size, leaf_hash(b"WrongLeaf"), proof, root),
        (leaf - 1, size, leaf_hash(LEAVES[leaf - 1]), proof, EMPTY_ROOT),
        (leaf - 1, size, leaf_hash(LEAVES[leaf - 1]), [*proof, root], root),
        (leaf - 1, size, leaf_hash(LEAVES[leaf - 1]), [root, *proof], root),
        (leaf - 1, size, leaf_hash(LEAVES[leaf - 1]), [*proof, b""], root),
    ]
    if proof:
        wrong.append((leaf - 1, size, leaf_hash(LEAVES[leaf - 1]), proof[:-1], root))
    for probe in wrong:
        assert not verify_inclusion(*probe), probe


@pytest.mark.parametrize(("first", "second", "path"), CONSISTENCY)
def test_consistency_vectors_generated_and_verified(first, second, path):
    proof = MemoryTree(LEAVES[:second]).consistency(first, second)
    assert [p.hex() for p in proof] == path
    root1, root2 = bytes.fromhex(ROOTS[first - 1]), bytes.fromhex(ROOTS[second - 1])
    assert verify_consistency(first, second, root1, root2, proof)
    if not proof:
        return
    for probe in [
        (first - 1, second, root1, root2, proof),
        (first + 1, second, root1, root2, proof),
        (first, second * 2, root1, root2, proof),
        (first, second, root2, root1, proof),
        (first, second, root1, root2, []),
        (first, second, root1, root2, proof[:-1]),
        (first, second, root1, root2, [*proof, root1]),
        (first, second, root1, root2, [proof[0], *proof]),
    ]:
        assert not verify_consistency(*probe), probe


def test_edge_sizes():
    assert not verify_inclusion(0, 0, leaf_hash(b""), [], EMPTY_ROOT)
    assert verify_consistency(0, 5, EMPTY_ROOT, bytes.fromhex(ROOTS[4]), [])
    assert not verify_consistency(2, 1, bytes.fromhex(ROOTS[1]), bytes.fromhex(ROOTS[0]), [])
    assert not verify_consistency(1, 1, bytes.fromhex(ROOTS[0]), bytes.fromhex(ROOTS[1]), [])


def _flip(path: list[bytes], index: int, bit: int) -> list[bytes]:
    changed = list(path)
    item = bytearray(changed[index])
    item[bit // 8 % len(item)] ^= 1 << (bit % 8)
    changed[index] = bytes(item)
    return changed


@settings(max_examples=60, deadline=None)
@given(
    leaves=st.lists(st.binary(max_size=8), min_size=1, max_size=64),
    data=st.data(),
)
def test_every_proof_verifies_and_a_flipped_bit_fails(leaves, data):
    tree = MemoryTree(leaves)
    n = len(leaves)
    # The stored layout (audit.tree.StoredTree) computes the same roots and paths.
    store: dict[int, list[str]] = {}
    stored = StoredTree(lambda sizes: {s: store[s] for s in sizes})
    for i, leaf in enumerate(leaves):
        stored.nodes.clear()
        store[i + 1], root = stored.append(i, leaf_hash(leaf))
        assert root == tree.mth(0, i + 1)
    bit = data.draw(st.integers(0, 255))
    for i in range(n):
        path = tree.inclusion(i)
        assert stored.inclusion(i, n) == path
        assert verify_inclusion(i, n, leaf_hash(leaves[i]), path, tree.root)
        if path:
            at = data.draw(st.integers(0, len(path) - 1))
            assert not verify_inclusion(i, n, leaf_hash(leaves[i]), _flip(path, at, bit), tree.root)
        assert not verify_inclusion(i, n, leaf_hash(leaves[i]), path, _flip([tree.root], 0, bit)[0])
    for m in range(1, n + 1):
        path = tree.consistency(m, n)
        assert stored.consistency(m, n) == path
        first_root = tree.mth(0, m)
        assert verify_consistency(m, n, first_root, tree.root, path)
        if path:
            at = data.draw(st.integers(0, len(path) - 1))
            assert not verify_consistency(m, n, first_root, tree.root, _flip(path, at, bit))
            assert not verify_consistency(m, n, _flip([first_root], 0, bit)[0], tree.root, path)
