"""Tamper-evident history, the parts an auditor runs: the per-stream chain
hash, and the check of a proof bundle (an identity's events, their chain and
their inclusion proofs against a signed checkpoint) and of a consistency proof
between two checkpoints. Pure, no I/O: the same code runs in the server (which
writes the chain and the tree) and in the client-only verifier, which needs
only the log's public key (docs/auditing.md, "Tamper-evident history").

The chain hash of an event is

    SHA-256(CHAIN_TAG || stream id (16 bytes) || version (8 bytes, big endian)
            || previous hash (32 bytes; zeros for version 1)
            || length of topic (4 bytes, big endian) || topic (UTF-8) || state)

over the event exactly as stored (topic and state bytes, before any upcasting):
everything an event store row holds that never changes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kandev_es_client.merkle import ProofError, leaf_hash, verify_consistency, verify_inclusion
from kandev_es_client.signed_note import Checkpoint, Keyring, NoteError

CHAIN_TAG = b"kandev-es/event-chain/v1\x00"
GENESIS = bytes(32)
BUNDLE_FORMAT = "kandev-es/proof-bundle/v1"
CONSISTENCY_FORMAT = "kandev-es/consistency-proof/v1"


def chain_hash(
    stream_id: uuid.UUID, version: int, previous: bytes, topic: str, state: bytes
) -> bytes:
    encoded = topic.encode()
    return hashlib.sha256(
        b"".join(
            (
                CHAIN_TAG,
                stream_id.bytes,
                version.to_bytes(8, "big"),
                previous,
                len(encoded).to_bytes(4, "big"),
                encoded,
                state,
            )
        )
    ).digest()


def chain(stream_id: uuid.UUID, events: Sequence[tuple[int, str, bytes]]) -> list[bytes]:
    """The chain hashes of a whole stream's (version, topic, state), in order."""
    hashes: list[bytes] = []
    previous = GENESIS
    for version, topic, state in events:
        previous = chain_hash(stream_id, version, previous, topic, state)
        hashes.append(previous)
    return hashes


@dataclass(frozen=True)
class EventFinding:
    version: int
    event: str
    status: str  # "verified", "pending" (after the checkpoint) or "failed"
    problem: str | None = None


@dataclass
class BundleReport:
    stream_id: str
    checkpoint: Checkpoint | None
    findings: list[EventFinding] = field(default_factory=list)
    problem: str | None = None  # a problem with the bundle as a whole

    @property
    def ok(self) -> bool:
        return self.problem is None and all(f.status != "failed" for f in self.findings)

    def lines(self) -> list[str]:
        head = (
            f"stream {self.stream_id} against checkpoint {self.checkpoint.origin}"
            f" size {self.checkpoint.size}"
            if self.checkpoint
            else f"stream {self.stream_id}"
        )
        out = [head]
        if self.problem:
            out.append(f"  FAILED: {self.problem}")
        for f in self.findings:
            detail = f": {f.problem}" if f.problem else ""
            out.append(f"  v{f.version} {f.event}: {f.status}{detail}")
        out.append("OK" if self.ok else "FAILED")
        return out


def event_name(topic: str) -> str:
    """``module:Class.Event`` -> ``Event``, for people reading a report."""
    return topic.rsplit(":", 1)[-1].rsplit(".", 1)[-1]


def _hash(value: Any, what: str) -> bytes:
    try:
        decoded = base64.b64decode(str(value), validate=True)
    except binascii.Error:
        raise ProofError(f"{what} is not base64") from None
    if len(decoded) != 32:
        raise ProofError(f"{what} is not 32 bytes")
    return decoded


def _check_event(
    stream_id: uuid.UUID, previous: bytes, expected_version: int, item: Mapping[str, Any],
    checkpoint: Checkpoint,
) -> tuple[EventFinding, bytes]:
    """One event of a bundle: its link in the chain, then its leaf in the tree.
    Returns the finding and the hash the next event must chain from."""
    version = int(item["version"])
    topic = str(item["topic"])
    name = event_name(topic)
    state = base64.b64decode(str(item["state"]), validate=True)
    claimed = _hash(item["hash"], f"v{version} hash")
    if version != expected_version:
        return EventFinding(version, name, "failed", f"expected version {expected_version}"
                            " (an event is missing or out of order)"), claimed
    recomputed = chain_hash(stream_id, version, previous, topic, state)
    if recomputed != claimed:
        return EventFinding(version, name, "failed", "its bytes or its place in the stream"
                            " changed: the chain hash does not match"), claimed
    index = item.get("leaf_index")
    if index is None or int(index) >= checkpoint.size:
        return EventFinding(version, name, "pending", "written after this checkpoint"), claimed
    proof = [_hash(p, f"v{version} proof hash") for p in item.get("inclusion") or []]
    try:
        verify_inclusion(int(index), checkpoint.size, leaf_hash(recomputed), proof,
                         checkpoint.root)
    except ProofError as error:
        return EventFinding(version, name, "failed", f"not in the log at leaf {index}:"
                            f" {error}"), claimed
    return EventFinding(version, name, "verified"), claimed


def verify_bundle(
    bundle: Mapping[str, Any], keyring: Keyring, origin: str | None = None
) -> BundleReport:
    """Checks a proof bundle with only the keyring: the checkpoint's
    signature, every event's chain link from version 1, and every event the
    checkpoint covers against its root. Never raises for a bad bundle: the
    report says which event fails and why."""
    stream = str(bundle.get("stream_id"))
    try:
        if bundle.get("format") != BUNDLE_FORMAT:
            raise NoteError(f"not a {BUNDLE_FORMAT} bundle")
        stream_id = uuid.UUID(stream)
        checkpoint = keyring.open_checkpoint(str(bundle["checkpoint"]), origin)
    except (NoteError, ValueError, KeyError, TypeError) as error:
        return BundleReport(stream, None, problem=str(error))
    report = BundleReport(stream, checkpoint)
    previous = GENESIS
    try:
        for expected, item in enumerate(bundle.get("events") or [], start=1):
            finding, previous = _check_event(stream_id, previous, expected, item, checkpoint)
            report.findings.append(finding)
    except (ProofError, ValueError, KeyError, TypeError, binascii.Error) as error:
        report.problem = f"malformed event: {error}"
    if not report.findings and report.problem is None:
        report.problem = "the bundle holds no event"
    return report


def verify_consistency_bundle(
    bundle: Mapping[str, Any], keyring: Keyring, origin: str | None = None
) -> tuple[Checkpoint, Checkpoint]:
    """Both checkpoints signed by the keyring, and the newer one extends the
    older one (an append-only log: nothing the older covered has changed).
    Raises NoteError or ProofError saying what fails."""
    if bundle.get("format") != CONSISTENCY_FORMAT:
        raise NoteError(f"not a {CONSISTENCY_FORMAT} document")
    old = keyring.open_checkpoint(str(bundle["old"]), origin)
    new = keyring.open_checkpoint(str(bundle["new"]), origin)
    if old.origin != new.origin:
        raise NoteError("the two checkpoints are of different logs")
    proof = [_hash(p, "proof hash") for p in bundle.get("proof") or []]
    verify_consistency(old.size, new.size, old.root, new.root, proof)
    return old, new
