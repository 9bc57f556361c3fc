"""RFC 9162 tree hashing and proofs, checked against the transparency-dev/merkle
test vectors (tests/fixtures/merkle/transparency-dev-merkle.json names its source
and commit): roots of every size, the proofs those vectors publish generated
byte for byte, and every vector's verification outcome, good and bad alike."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from kandev_es_client import merkle

VECTORS = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "merkle" / "transparency-dev-merkle.json")
    .read_text(encoding="utf-8")
)
LEAVES = [bytes.fromhex(h) for h in VECTORS["leaf_inputs_hex"]]


def b64(values):
    return [base64.b64decode(v) for v in values or []]


def tree_of(count):
    """The vectors' tree: leaf i is HASH(0x00 || input i) (MemoryTree takes the leaf hash)."""
    tree = merkle.MemoryTree()
    for leaf in LEAVES[:count]:
        tree.append_leaf_hash(merkle.leaf_hash(leaf))
    return tree


def test_the_hasher_matches_the_published_leaf_node_and_empty_hashes():
    assert merkle.EMPTY_ROOT.hex() == VECTORS["root_hashes_hex"][0]
    assert merkle.leaf_hash(b"").hex() == VECTORS["root_hashes_hex"][1]
    assert merkle.leaf_hash(b"L123456").hex() == VECTORS["hasher"]["leaf_L123456"]
    assert merkle.node_hash(b"N123", b"N456").hex() == VECTORS["hasher"]["children_N123_N456"]


def test_the_root_of_every_size_matches_the_published_roots():
    tree = tree_of(8)
    assert [tree.root(n).hex() for n in range(9)] == VECTORS["root_hashes_hex"]


def test_the_tree_appends_chain_hashes_as_leaf_data():
    tree = merkle.MemoryTree()
    for leaf in LEAVES:
        tree.append(leaf)
    assert tree.root().hex() == VECTORS["root_hashes_hex"][8]


@pytest.mark.parametrize("name", sorted(k for k in VECTORS["inclusion"] if "happy-path" in k))
def test_inclusion_proofs_are_generated_as_published(name):
    case = VECTORS["inclusion"][name]
    tree = tree_of(case["treeSize"])
    proof = merkle.inclusion_proof(tree.node, case["leafIdx"], case["treeSize"])
    assert proof == b64(case["proof"])
    assert tree.root(case["treeSize"]) == base64.b64decode(case["root"])


@pytest.mark.parametrize("name", sorted(k for k in VECTORS["consistency"] if "happy-path" in k))
def test_consistency_proofs_are_generated_as_published(name):
    case = VECTORS["consistency"][name]
    tree = tree_of(case["size2"])
    assert merkle.consistency_proof(tree.node, case["size1"], case["size2"]) == b64(case["proof"])


@pytest.mark.parametrize("name", sorted(VECTORS["inclusion"]))
def test_inclusion_verification_agrees_with_every_vector(name):
    case = VECTORS["inclusion"][name]
    def verify():
        merkle.verify_inclusion(case["leafIdx"], case["treeSize"],
                                base64.b64decode(case["leafHash"] or ""), b64(case["proof"]),
                                base64.b64decode(case["root"] or ""))
    if case["wantErr"]:
        with pytest.raises(merkle.ProofError):
            verify()
    else:
        verify()


@pytest.mark.parametrize("name", sorted(VECTORS["consistency"]))
def test_consistency_verification_agrees_with_every_vector(name):
    case = VECTORS["consistency"][name]
    def verify():
        merkle.verify_consistency(case["size1"], case["size2"],
                                  base64.b64decode(case["root1"] or ""),
                                  base64.b64decode(case["root2"] or ""), b64(case["proof"]))
    if case["wantErr"]:
        with pytest.raises(merkle.ProofError):
            verify()
    else:
        verify()


def test_every_proof_of_a_larger_tree_verifies_and_a_changed_leaf_does_not():
    tree = merkle.MemoryTree()
    for i in range(37):
        tree.append(i.to_bytes(4, "big"))
    for size in (1, 2, 5, 16, 17, 37):
        root = tree.root(size)
        for index in range(size):
            proof = merkle.inclusion_proof(tree.node, index, size)
            merkle.verify_inclusion(index, size, tree.node(0, index), proof, root)
        for old in range(1, size + 1):
            proof = merkle.consistency_proof(tree.node, old, size)
            merkle.verify_consistency(old, size, tree.root(old), root, proof)
    with pytest.raises(merkle.ProofError):
        merkle.verify_inclusion(3, 37, merkle.leaf_hash(b"forged"),
                                merkle.inclusion_proof(tree.node, 3, 37), tree.root())
