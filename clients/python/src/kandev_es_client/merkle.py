"""RFC 9162 (Certificate Transparency v2, section 2.1) Merkle tree hashing,
inclusion and consistency proofs: generation and verification. Pure, no I/O,
so the client-only distribution verifies proofs with no server and no database.

A tree's nodes are named (level, index): the hash of the perfect subtree of
2**level leaves starting at leaf ``index * 2**level``. Only such perfect
subtrees are ever stored (they never change once complete), so a proof or a
root at any size needs O(log n) of them (``NodeSource``). Checked against the
transparency-dev/merkle test vectors (tests/fixtures/merkle/).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable, Sequence
from typing import Any

HASH_SIZE = 32
LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"
EMPTY_ROOT = hashlib.sha256(b"").digest()

# (level, index) -> hash of that perfect subtree; raises KeyError when absent.
NodeSource = Callable[[int, int], bytes]


class ProofError(ValueError):
    """A proof that does not prove what it claims (or a malformed request)."""


def decode_hash(value: Any, what: str) -> bytes:
    """A proof's base64 SHA-256 hash; ProofError naming ``what`` otherwise."""
    try:
        decoded = base64.b64decode(str(value), validate=True)
    except binascii.Error:
        raise ProofError(f"{what} is not base64") from None
    if len(decoded) != 32:
        raise ProofError(f"{what} is not 32 bytes")
    return decoded


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(LEAF_PREFIX + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(NODE_PREFIX + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than ``n`` (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def subtree_hash(nodes: NodeSource, start: int, end: int) -> bytes:
    """MTH(D[start:end]) for a range whose start is a multiple of the
    largest power of two not above its length, as RFC 9162's recursion makes."""
    size = end - start
    if size <= 0:
        return EMPTY_ROOT
    if size & (size - 1) == 0 and start % size == 0:
        level = size.bit_length() - 1
        return nodes(level, start >> level)
    k = _split(size)
    return node_hash(subtree_hash(nodes, start, start + k), subtree_hash(nodes, start + k, end))


def root_hash(nodes: NodeSource, size: int) -> bytes:
    return subtree_hash(nodes, 0, size)


def appended_nodes(
    nodes: NodeSource, size: int, data_hash: bytes
) -> list[tuple[int, int, bytes]]:
    """The perfect subtrees that become complete when the leaf for
    ``data_hash`` is appended to a tree of ``size`` leaves: the leaf itself,
    then each parent it completes (its left siblings come from ``nodes``)."""
    return _completed(nodes, size, leaf_hash(data_hash))


def _completed(nodes: NodeSource, size: int, leaf: bytes) -> list[tuple[int, int, bytes]]:
    current = leaf
    made = [(0, size, current)]
    index, level = size, 0
    while index & 1:
        current = node_hash(nodes(level, index - 1), current)
        index >>= 1
        level += 1
        made.append((level, index, current))
    return made


class MemoryTree:
    """A whole tree in memory: for the verifier's recomputation and tests."""

    def __init__(self) -> None:
        self.nodes: dict[tuple[int, int], bytes] = {}
        self.size = 0

    def node(self, level: int, index: int) -> bytes:
        return self.nodes[(level, index)]

    def append(self, data: bytes) -> None:
        self.append_leaf_hash(leaf_hash(data))

    def append_leaf_hash(self, value: bytes) -> None:
        """Append a leaf given as its already-computed leaf hash."""
        for level, index, made in _completed(self.node, self.size, value):
            self.nodes[(level, index)] = made
        self.size += 1

    def root(self, size: int | None = None) -> bytes:
        return root_hash(self.node, self.size if size is None else size)


def inclusion_proof(nodes: NodeSource, index: int, size: int) -> list[bytes]:
    """PATH(index, D[0:size]) (RFC 9162 2.1.3.1), leaf to root."""
    if not 0 <= index < size:
        raise ProofError(f"leaf {index} is not in a tree of size {size}")
    path: list[bytes] = []
    start, end = 0, size
    while end - start > 1:
        k = _split(end - start)
        if index < start + k:
            path.append(subtree_hash(nodes, start + k, end))
            end = start + k
        else:
            path.append(subtree_hash(nodes, start, start + k))
            start += k
    path.reverse()
    return path


def consistency_proof(nodes: NodeSource, old_size: int, new_size: int) -> list[bytes]:
    """PROOF(old_size, D[0:new_size]) (RFC 9162 2.1.4.1)."""
    if not 0 <= old_size <= new_size:
        raise ProofError(f"no consistency proof from size {old_size} to {new_size}")
    if old_size in (0, new_size):
        return []
    proof: list[bytes] = []
    start, end, whole = 0, new_size, True
    while old_size != end:
        k = _split(end - start)
        if old_size - start <= k:
            proof.append(subtree_hash(nodes, start + k, end))
            end = start + k
        else:
            proof.append(subtree_hash(nodes, start, start + k))
            start += k
            whole = False
    if not whole:
        proof.append(subtree_hash(nodes, start, end))
    proof.reverse()
    return proof


def _check_hashes(hashes: Sequence[bytes]) -> None:
    if any(len(h) != HASH_SIZE for h in hashes):
        raise ProofError("a proof hash is not 32 bytes")


def root_from_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes]) -> bytes:
    """The root that ``proof`` implies for ``leaf`` (a leaf hash) at ``index``
    (RFC 9162 2.1.3.2); raises ProofError for a proof of the wrong shape."""
    if not 0 <= index < size:
        raise ProofError(f"leaf {index} is not in a tree of size {size}")
    _check_hashes([leaf, *proof])
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            raise ProofError("the inclusion proof is too long")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("the inclusion proof is too short")
    return r


def verify_inclusion(
    index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes
) -> None:
    """Raises ProofError unless ``leaf`` (a leaf hash) is leaf ``index`` of
    the tree of ``size`` leaves whose root is ``root``."""
    if root_from_inclusion(index, size, leaf, proof) != root:
        raise ProofError("the inclusion proof does not lead to the root")


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> None:
    """Raises ProofError unless the tree of ``new_size`` leaves with
    ``new_root`` extends the one of ``old_size`` with ``old_root`` (RFC 9162 2.1.4.2)."""
    if old_size > new_size:
        raise ProofError(f"size {old_size} is above size {new_size}")
    if old_size == 0:
        # As transparency-dev/merkle: every tree extends the empty one, so
        # such a "proof" proves nothing and is refused rather than passed.
        raise ProofError("a consistency proof from the empty tree proves nothing")
    _check_hashes(proof)
    if old_size == new_size:
        if proof:
            raise ProofError("equal sizes need an empty proof")
        if old_root != new_root:
            raise ProofError("equal sizes with different roots")
        return
    if not proof:
        raise ProofError("the consistency proof is empty")
    path = list(proof)
    if old_size & (old_size - 1) == 0:
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("the consistency proof is too long")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("the consistency proof is too short")
    if fr != old_root:
        raise ProofError("the consistency proof does not lead to the old root")
    if sr != new_root:
        raise ProofError("the consistency proof does not lead to the new root")
