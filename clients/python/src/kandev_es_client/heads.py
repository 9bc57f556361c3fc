"""The map of stream heads a checkpoint commits to (docs/auditing.md, "A bundle
is the whole stream"): for every stream in the log at the checkpoint's size,
its last logged version and that event's chain hash. Pure, no I/O: the
sequencer builds it, the offline verifier checks a stream's entry with it.

The map is a Merkle tree of fixed depth over 2^16 **buckets**: a stream's
bucket is the first two bytes of SHA-256(stream id), and a bucket's hash
commits to all of its entries, sorted by stream id:

    entry       = stream id (16 bytes) || version (8, big endian) || chain hash (32)
    bucket hash = SHA-256(0x02 || count (4, big endian) || entry || entry ...)
    node hash   = SHA-256(0x01 || left || right)     (RFC 9162's interior node)
    root        = the node at level 16

A proof for a stream is its bucket's entries and the 16 sibling hashes from
the bucket up. It proves the stream's head (or that the stream is not in
the map: a bucket without it) because the verifier recomputes the bucket
from every entry in it. It is a sparse Merkle tree whose bottom levels are a
sorted list: proofs grow with a bucket's fill (n / 65,536 entries, 56 bytes
each), and a checkpoint rewrites 16 nodes per stream it changed.

A checkpoint carries the root as an extension line (c2sp.org/tlog-checkpoint
allows them; a witness's cosignature covers them, c2sp.org/tlog-cosignature):

    kandev-es/stream-heads/v1 <base64 root>
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kandev_es_client.merkle import ProofError, decode_hash, node_hash

DEPTH = 16
BUCKET_PREFIX = b"\x02"
EXTENSION = "kandev-es/stream-heads/v1"
MAX_BUCKET_ENTRIES = 100_000


@dataclass(frozen=True, order=True)
class Head:
    stream: uuid.UUID
    version: int
    chain_hash: bytes

    def encoded(self) -> bytes:
        return self.stream.bytes + self.version.to_bytes(8, "big") + self.chain_hash


def bucket_of(stream: uuid.UUID) -> int:
    return int.from_bytes(hashlib.sha256(stream.bytes).digest()[:2], "big")


def bucket_hash(entries: Iterable[Head]) -> bytes:
    ordered = sorted(entries, key=lambda h: h.stream.bytes)
    return hashlib.sha256(
        BUCKET_PREFIX + len(ordered).to_bytes(4, "big") + b"".join(h.encoded() for h in ordered)
    ).digest()


def _empty_hashes() -> list[bytes]:
    """The hash of an empty subtree at each level (0: an empty bucket)."""
    hashes = [bucket_hash(())]
    for _ in range(DEPTH):
        hashes.append(node_hash(hashes[-1], hashes[-1]))
    return hashes


EMPTY = _empty_hashes()

# (level, index) -> the stored hash of that node, or None where the subtree is empty.
MapSource = Callable[[int, int], bytes | None]


def node(source: MapSource, level: int, index: int) -> bytes:
    found = source(level, index)
    return EMPTY[level] if found is None else found


def updated_nodes(
    source: MapSource, buckets: Mapping[int, bytes]
) -> dict[tuple[int, int], bytes]:
    """The nodes to write when ``buckets`` (index -> new bucket hash) change:
    the buckets themselves and every ancestor up to the root (level DEPTH)."""
    made: dict[tuple[int, int], bytes] = {(0, b): h for b, h in buckets.items()}
    level_indexes = set(buckets)
    for level in range(1, DEPTH + 1):
        parents = {i >> 1 for i in level_indexes}
        for parent in parents:
            children = [(level - 1, 2 * parent + side) for side in (0, 1)]
            left, right = (made.get(key) or node(source, *key) for key in children)
            made[(level, parent)] = node_hash(left, right)
        level_indexes = parents
    return made


def siblings(bucket: int) -> list[tuple[int, int]]:
    """The nodes a proof for ``bucket`` needs, from the bucket's level up."""
    return [(level, (bucket >> level) ^ 1) for level in range(DEPTH)]


def root_of(source: MapSource) -> bytes:
    return node(source, DEPTH, 0)


def memory_root(heads: Iterable[Head]) -> bytes:
    """The root of the map of ``heads``, built in memory (the audit, tests)."""
    buckets: dict[int, list[Head]] = {}
    for head in heads:
        buckets.setdefault(bucket_of(head.stream), []).append(head)
    made = updated_nodes(lambda level, index: None,
                         {b: bucket_hash(entries) for b, entries in buckets.items()})
    return made.get((DEPTH, 0), EMPTY[DEPTH])


def extension_root(extensions: Sequence[str]) -> bytes | None:
    """The map root a checkpoint's extension lines carry, or None."""
    for line in extensions:
        name, _, value = line.partition(" ")
        if name == EXTENSION:
            try:
                root = base64.b64decode(value, validate=True)
            except binascii.Error:
                raise ProofError("the checkpoint's stream-heads line is not base64") from None
            if len(root) != 32:
                raise ProofError("the checkpoint's stream-heads root is not 32 bytes")
            return root
    return None


def extension_line(root: bytes) -> str:
    return f"{EXTENSION} {base64.b64encode(root).decode()}"


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def proof_document(entries: Sequence[Head], path: Sequence[bytes]) -> dict[str, Any]:
    return {
        "entries": [[str(h.stream), h.version, _b64(h.chain_hash)] for h in entries],
        "path": [_b64(p) for p in path],
    }


def _entries(raw: Any, bucket: int) -> list[Head]:
    if not isinstance(raw, list) or len(raw) > MAX_BUCKET_ENTRIES:
        raise ProofError("the stream-heads proof's entries are not a list")
    entries: list[Head] = []
    for item in raw:
        if not isinstance(item, list) or len(item) != 3:
            raise ProofError("a stream-heads entry is [stream id, version, chain hash]")
        try:
            stream = uuid.UUID(str(item[0]))
        except ValueError:
            raise ProofError(
                f"a stream-heads entry's stream {str(item[0])[:40]!r} is not a UUID"
            ) from None
        version = item[1]
        if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version < 2**63:
            raise ProofError(f"stream {stream}'s head version is not a whole number from 1")
        if bucket_of(stream) != bucket:
            raise ProofError(f"stream {stream} is not in the bucket the proof is for")
        entries.append(Head(stream, version, decode_hash(item[2], f"stream {stream}'s head hash")))
    if [e.stream.bytes for e in entries] != sorted({e.stream.bytes for e in entries}):
        raise ProofError("the stream-heads entries are not sorted by stream id, once each")
    return entries


def verify_head(stream: uuid.UUID, proof: Any, root: bytes) -> Head | None:
    """The head of ``stream`` in the map whose root is ``root``, from its
    proof (None: the stream is not in the map); ProofError when the proof
    does not lead to the root."""
    if not isinstance(proof, Mapping):
        raise ProofError("the bundle carries no stream-heads proof")
    bucket = bucket_of(stream)
    entries = _entries(proof.get("entries"), bucket)
    path = proof.get("path")
    if not isinstance(path, list) or len(path) != DEPTH:
        raise ProofError(f"the stream-heads proof's path is not {DEPTH} hashes")
    value = bucket_hash(entries)
    for level, raw in enumerate(path):
        sibling = decode_hash(raw, "a stream-heads path hash")
        value = node_hash(sibling, value) if bucket >> level & 1 else node_hash(value, sibling)
    if value != root:
        raise ProofError("the stream-heads proof does not lead to the checkpoint's map root")
    return next((e for e in entries if e.stream == stream), None)
