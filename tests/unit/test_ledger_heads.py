"""The map of stream heads (kandev_es_client.heads): a map updated bucket by
bucket has the root of one built at once; a stream's proof gives its head, or
shows it absent, and any change to the entries or the path fails."""

from __future__ import annotations

import hashlib
import uuid

import pytest
from kandev_es_client import heads
from kandev_es_client.merkle import ProofError


def head(n: int, version: int = 1) -> heads.Head:
    return heads.Head(uuid.UUID(int=n), version, hashlib.sha256(b"%d/%d" % (n, version)).digest())


class Stored:
    """A map kept as the sequencer keeps it: nodes written level by level."""

    def __init__(self) -> None:
        self.nodes: dict[tuple[int, int], bytes] = {}
        self.entries: dict[uuid.UUID, heads.Head] = {}

    def source(self, level: int, index: int) -> bytes | None:
        return self.nodes.get((level, index))

    def put(self, *new: heads.Head) -> None:
        for h in new:
            self.entries[h.stream] = h
        changed = {heads.bucket_of(h.stream) for h in new}
        self.nodes.update(heads.updated_nodes(self.source, {
            b: heads.bucket_hash(e for e in self.entries.values() if heads.bucket_of(e.stream) == b)
            for b in changed}))

    def proof(self, stream: uuid.UUID) -> dict:
        bucket = heads.bucket_of(stream)
        mine = sorted((e for e in self.entries.values() if heads.bucket_of(e.stream) == bucket),
                      key=lambda e: e.stream.bytes)
        return heads.proof_document(mine, [heads.node(self.source, lv, ix)
                                           for lv, ix in heads.siblings(bucket)])


def test_a_map_updated_in_batches_has_the_root_of_one_built_at_once():
    stored = Stored()
    assert heads.root_of(stored.source) == heads.memory_root([]) == heads.EMPTY[heads.DEPTH]
    stored.put(*(head(n) for n in range(300)))
    stored.put(*(head(n, 2) for n in range(0, 300, 7)), head(1000))
    assert heads.root_of(stored.source) == heads.memory_root(stored.entries.values())
    assert heads.memory_root(stored.entries.values()) != heads.memory_root(
        [*stored.entries.values(), head(1001)])


def test_a_proof_gives_the_head_or_shows_the_stream_absent():
    stored = Stored()
    stored.put(*(head(n) for n in range(50)), head(7, 4))
    root = heads.root_of(stored.source)
    assert heads.verify_head(uuid.UUID(int=7), stored.proof(uuid.UUID(int=7)), root) == head(7, 4)
    absent = uuid.UUID(int=99)
    assert heads.verify_head(absent, stored.proof(absent), root) is None


@pytest.mark.parametrize("change, said", [
    (lambda p: p["entries"][0].__setitem__(1, 9), "does not lead to the checkpoint's map root"),
    (lambda p: p["entries"].clear(), "does not lead"),
    (lambda p: p["entries"].append(p["entries"][0]), "once each"),
    (lambda p: p["path"].reverse(), "does not lead"),
    (lambda p: p["path"].pop(), "is not 16 hashes"),
    (lambda p: p["entries"][0].__setitem__(1, 1.5), "not a whole number"),
    (lambda p: p["entries"][0].__setitem__(0, str(uuid.UUID(int=3))), "not in the bucket"),
])
def test_a_changed_proof_fails(change, said):
    stored = Stored()
    stored.put(*(head(n) for n in range(20)))
    stream = uuid.UUID(int=7)
    proof = stored.proof(stream)
    change(proof)
    with pytest.raises(ProofError, match=said):
        heads.verify_head(stream, proof, heads.root_of(stored.source))
