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
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kandev_es_client import heads
from kandev_es_client.merkle import (
    EMPTY_ROOT,
    ProofError,
    decode_hash,
    leaf_hash,
    verify_consistency,
    verify_inclusion,
)
from kandev_es_client.signed_note import (
    Checkpoint,
    Keyring,
    NoteError,
    open_note,
    split_note,
)

CHAIN_TAG = b"kandev-es/event-chain/v1\x00"
REDACTED_TAG = b"kandev-es/redacted-event/v1\x00"
STATEMENT_FORMAT = "kandev-es/redaction-statement/v1"
GENESIS = bytes(32)
BUNDLE_FORMAT = "kandev-es/proof-bundle/v1"
CONSISTENCY_FORMAT = "kandev-es/consistency-proof/v1"
# An identity's stream id is uuid5(this, "<workspace id>\x00<external id>")
# (the server's kandev_es.domain.external_id.identity_id).
IDENTITY_NAMESPACE = uuid.UUID("6f6b9c1e-5c7a-4d0e-9a43-2f1d8f6a0b71")
# Leaf indexes, sizes and versions are unsigned 63-bit integers (as in the
# stores' BIGINT columns): anything else is refused before it is used.
MAX_INTEGER = 2**63 - 1


def chain_hash(
    stream_id: uuid.UUID, version: int, previous: bytes, topic: str, state: bytes
) -> bytes:
    return _hash(CHAIN_TAG, stream_id, version, previous, topic, state)


def _hash(
    tag: bytes, stream_id: uuid.UUID, version: int, previous: bytes, topic: str, state: bytes
) -> bytes:
    encoded = topic.encode()
    return hashlib.sha256(
        b"".join(
            (
                tag,
                stream_id.bytes,
                version.to_bytes(8, "big"),
                previous,
                len(encoded).to_bytes(4, "big"),
                encoded,
                state,
            )
        )
    ).digest()


def redacted_hash(
    stream_id: uuid.UUID, version: int, previous: bytes, topic: str, state: bytes
) -> bytes:
    """What a redaction statement records of an event's new bytes: the chain
    hash's layout under a tag of its own, so it binds the rewritten state to
    the event's stream, version, place (the original previous hash) and topic."""
    return _hash(REDACTED_TAG, stream_id, version, previous, topic, state)


@dataclass(frozen=True)
class Redaction:
    """One entry of a redaction statement (docs/auditing.md: Erasure): an
    event written before the upgrade in cleartext, rewritten with its free
    text null. ``original`` is the chain hash it was logged with (so every
    chain, leaf, checkpoint and proof stays as it was); ``redacted`` is
    ``redacted_hash`` of its new bytes; ``statement`` the statement's place
    (its event's version in a bundle, its position in the store)."""

    stream: uuid.UUID
    version: int
    original: bytes
    redacted: bytes
    statement: int


def statement_text(origin: str, task_id: uuid.UUID, entries: Sequence[Redaction]) -> str:
    """A redaction statement's text, which the log's key signs as a signed
    note: the format, the log's origin, the task, then one line per event
    rewritten: stream, version, original and redacted hash (base64)."""
    lines = [STATEMENT_FORMAT, origin, f"task {task_id}"]
    lines.extend(f"{e.stream} {e.version} {_b64(e.original)} {_b64(e.redacted)}" for e in entries)
    return "\n".join(lines) + "\n"


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def statement_entries(note: str, statement: int) -> list[Redaction]:
    """The entries of a redaction statement's signed note, signature NOT
    checked (``redactions_in`` checks it). Raises ProofError when it is not
    one."""
    try:
        text, _ = split_note(note)
        lines = text.split("\n")[:-1]
        if len(lines) < 3 or lines[0] != STATEMENT_FORMAT:
            raise ValueError(f"not a {STATEMENT_FORMAT} note")
        found = []
        for line in lines[3:]:
            stream, version, original, redacted = line.split(" ")
            found.append(Redaction(
                uuid.UUID(stream), integer(int(version), "a redacted event's version", 1),
                decode_hash(original, "a redaction's original hash"),
                decode_hash(redacted, "a redaction's redacted hash"), statement,
            ))  # fmt: skip
        return found
    except (ValueError, NoteError) as error:
        raise ProofError(f"a redaction statement is malformed: {error}") from None


def redactions_in(
    state: bytes, statement: int, keyring: Keyring, size: int | None
) -> list[Redaction]:
    """The entries of the redaction statement a ``Forgotten`` event's state
    holds (member ``redactions``: a note of the keyring's origin signed by a
    key whose window covers ``size``, the tree size that first logged the
    event; None: not logged yet, any key), none when it holds none. Raises
    ProofError for a statement that is not well formed or not so signed: a
    database writer without the log's key cannot make one, nor can a retired
    key's holder make one for a later place in the log."""
    if b'"redactions"' not in state:
        return []
    try:
        note = json.loads(state).get("redactions")
    except (ValueError, AttributeError):
        raise ProofError("a Forgotten event's state is not a JSON object") from None
    if note is None:
        return []
    if not isinstance(note, str):
        raise ProofError("a redaction statement is not a signed note")
    valid = [e.verifier for e in keyring.entries if size is None or e.covers(size)]
    try:
        text, _ = open_note(note, valid)
    except NoteError as error:
        raise ProofError(f"a redaction statement does not verify ({error})") from None
    origin = keyring.expected_origin
    if origin is not None and text.split("\n")[1:2] != [origin]:
        raise ProofError(f"a redaction statement of another log than {origin!r}")
    return statement_entries(note, statement)


def link(
    stream_id: uuid.UUID,
    version: int,
    previous: bytes,
    topic: str,
    state: bytes,
    redaction: Redaction | None = None,
) -> tuple[bytes, bool]:
    """The hash an event stands for in its chain and the log, and whether it
    is by ``redaction``: its chain hash, or -- for an event a statement
    redacted whose remaining bytes, topic and place are the ones the
    statement records -- the original chain hash the statement names."""
    if redaction is not None and (
        redacted_hash(stream_id, version, previous, topic, state) == redaction.redacted
    ):
        return redaction.original, True
    return chain_hash(stream_id, version, previous, topic, state), False


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
    redacted_by: int | None = None  # the version of the statement that redacted it


@dataclass
class BundleReport:
    stream_id: str
    checkpoint: Checkpoint | None
    findings: list[EventFinding] = field(default_factory=list)
    problem: str | None = None  # a problem with the bundle as a whole
    # The bundle against each checkpoint the auditor holds: (line, passed).
    held: list[tuple[str, bool]] = field(default_factory=list)
    label: str = ""  # "workspace W, external ID E", when the bundle says
    completeness: str = ""  # what the checkpoint's map of stream heads proves

    @property
    def ok(self) -> bool:
        return (
            self.problem is None
            and all(f.status != "failed" for f in self.findings)
            and all(passed for _, passed in self.held)
        )

    def lines(self) -> list[str]:
        head = f"stream {self.stream_id}" + (f" ({self.label})" if self.label else "")
        if self.checkpoint:
            head += f" against checkpoint {self.checkpoint.origin} size {self.checkpoint.size}"
        out = [head]
        if self.problem:
            out.append(f"  FAILED: {self.problem}")
        out.extend(f"  {line}" for line, _ in self.held)
        if self.completeness:
            out.append(f"  {self.completeness}")
        for f in self.findings:
            detail = f": {f.problem}" if f.problem else ""
            if f.redacted_by is not None and f.status == "verified":
                detail = f", redacted by statement v{f.redacted_by}, consistent"
            out.append(f"  v{f.version} {f.event}: {f.status}{detail}")
        out.append("OK" if self.ok else "FAILED")
        return out


def event_name(topic: str) -> str:
    """``module:Class.Event`` -> ``Event``, for people reading a report."""
    return topic.rsplit(":", 1)[-1].rsplit(".", 1)[-1]


def integer(value: Any, what: str, minimum: int = 0) -> int:
    """A JSON whole number from ``minimum`` up to MAX_INTEGER, or ProofError
    saying what it is instead (a string, a fraction, Infinity, true...)."""
    if isinstance(value, bool) or not isinstance(value, int):
        shown = "missing" if value is None else f"{json.dumps(value)[:40]}, not a whole number"
        raise ProofError(f"{what} is {shown}")
    if not minimum <= value <= MAX_INTEGER:
        raise ProofError(f"{what} {value} is out of range ({minimum} to 2^63 - 1)")
    return value


def _check_event(
    stream_id: uuid.UUID,
    previous: bytes,
    expected_version: int,
    item: Mapping[str, Any],
    checkpoint: Checkpoint,
    redactions: Mapping[int, Redaction],
) -> tuple[EventFinding, bytes]:
    """One event of a bundle: its link in the chain (an event a statement
    redacted stands for the original hash it names, when its remaining bytes
    are the ones the statement records), then its leaf in the tree.
    Returns the finding and the hash the next event must chain from."""
    if not isinstance(item, Mapping):
        raise ProofError(f"event {expected_version} is not a JSON object")
    version = integer(item.get("version"), f"event {expected_version}'s version", 1)
    topic = str(item["topic"])
    name = event_name(topic)
    try:
        state = base64.b64decode(str(item["state"]), validate=True)
    except binascii.Error:
        raise ProofError(f"v{version}'s state is not base64") from None
    claimed = decode_hash(item["hash"], f"v{version} hash")
    if version != expected_version:
        return EventFinding(
            version,
            name,
            "failed",
            f"expected version {expected_version} (an event is missing or out of order)",
        ), claimed
    recomputed, redacted = link(stream_id, version, previous, topic, state, redactions.get(version))
    by = redactions[version].statement if redacted else None
    if recomputed != claimed:
        return EventFinding(
            version,
            name,
            "failed",
            "its bytes or its place in the stream changed: the chain hash does not match",
        ), claimed
    raw = item.get("leaf_index")
    index = None if raw is None else integer(raw, f"v{version}'s leaf index")
    if index is None or index >= checkpoint.size:
        return EventFinding(version, name, "pending", "written after this checkpoint", by), claimed
    proof = [decode_hash(p, f"v{version} proof hash") for p in item.get("inclusion") or []]
    try:
        verify_inclusion(index, checkpoint.size, leaf_hash(recomputed), proof, checkpoint.root)
    except ProofError as error:
        return EventFinding(
            version, name, "failed", f"not in the log at leaf {index}: {error}"
        ), claimed
    return EventFinding(version, name, "verified", None, by), claimed


def _statements(
    stream_id: uuid.UUID, items: Sequence[Any], keyring: Keyring
) -> dict[int, Redaction]:
    """The redaction statements the stream's own ``Forgotten`` events make
    about its earlier events, by the version they redact (a statement counts
    only when it is itself verified: ``_check_redacted``)."""
    found: dict[int, Redaction] = {}
    for item in items:
        if not isinstance(item, Mapping) or event_name(str(item.get("topic"))) != "Forgotten":
            continue
        statement = integer(item.get("version"), "a statement's version", 1)
        try:
            state = base64.b64decode(str(item.get("state")), validate=True)
        except binascii.Error:
            raise ProofError(f"v{statement}'s state is not base64") from None
        index = item.get("leaf_index")
        size = None if index is None else integer(index, f"v{statement}'s leaf index") + 1
        for entry in redactions_in(state, statement, keyring, size):
            if entry.stream != stream_id or entry.version >= statement:
                continue
            kept = found.setdefault(entry.version, entry)
            if (kept.original, kept.redacted) != (entry.original, entry.redacted):
                raise ProofError(f"two redaction statements differ on v{entry.version}")
    return found


def _check_redacted(findings: list[EventFinding]) -> None:
    """A redacted event is proven only as far as its statement is: the
    statement's event must itself be verified under the checkpoint."""
    for position, finding in enumerate(findings):
        by = finding.redacted_by
        if by is None or finding.status == "failed":
            continue
        statement = findings[by - 1] if by <= len(findings) else None
        if statement is not None and statement.status == "verified":
            continue
        why = (
            "this checkpoint does not cover it yet: ask for a bundle against a later one"
            if statement is not None and statement.status == "pending"
            else "it does not verify"
        )
        findings[position] = EventFinding(
            finding.version, finding.event, "failed",
            f"rewritten by the redaction statement in v{by}, but {why}", by,
        )  # fmt: skip


def _check_order(items: Sequence[Any], findings: list[EventFinding]) -> None:
    """Leaf indexes rise with versions, and nothing after a pending event is
    in the log: a bundle cannot call an event pending while a later one of
    the same stream is logged."""
    last = -1
    for position, (item, finding) in enumerate(zip(items, findings, strict=False)):
        if finding.status == "failed":
            return
        if finding.status == "pending":
            last = MAX_INTEGER
            continue
        index = item["leaf_index"]
        if index <= last:
            after_pending = " (an earlier event is marked pending)" if last == MAX_INTEGER else ""
            findings[position] = EventFinding(
                finding.version,
                finding.event,
                "failed",
                f"leaf {index} is not after the stream's earlier events'{after_pending}",
            )
            return
        last = index


def identity_stream(workspace_id: str, external_id: str) -> uuid.UUID:
    return uuid.uuid5(IDENTITY_NAMESPACE, f"{workspace_id}\x00{external_id}")


def _check_labels(bundle: Mapping[str, Any], stream_id: uuid.UUID) -> str:
    """The bundle's labels name its stream — an identity's workspace and
    external ID (the stream id is derived from them), or a task's workspace
    and id — and its first event records the same; the label for the report."""
    workspace = bundle.get("workspace_id")
    external, task = bundle.get("external_id"), bundle.get("task_id")
    if not isinstance(workspace, str) or not isinstance(
        task if "task_id" in bundle else external, str
    ):
        raise NoteError("the bundle does not say which workspace and external ID or task it is for")
    workspace_id = _label_uuid(workspace, "workspace")
    if isinstance(task, str):
        label = f"workspace {workspace_id}, task {task}"
        named, external = _label_uuid(task, "task"), None
    else:
        label = f"workspace {workspace_id}, external ID {external!r}"
        named = identity_stream(str(workspace_id), str(external))
    if named != stream_id:
        raise NoteError(f"the bundle is labelled {label}, whose stream is {named}, not {stream_id}")
    events = bundle.get("events") or []
    first = events[0] if isinstance(events, list) and events else None
    if isinstance(first, Mapping) and first.get("version") == 1:
        _check_first(first, workspace_id, external, label)
    return label


def _label_uuid(value: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise NoteError(f"the bundle's {what} {value[:40]!r} is not a UUID") from None


def _check_first(
    first: Mapping[str, Any], workspace_id: uuid.UUID, external: str | None, label: str
) -> None:
    """An identity's Registered records its workspace and external ID, a
    task's Created its workspace."""
    try:
        state = json.loads(base64.b64decode(str(first.get("state")), validate=True))
        recorded = uuid.UUID(str(state["workspace_id"]["_data_"]))
        recorded_external = state["external_id"] if external is not None else None
    except (ValueError, KeyError, TypeError, binascii.Error):
        kind = "an identity's Registered" if external is not None else "a task's Created"
        raise NoteError(f"v1 is not {kind} event") from None
    if (recorded, recorded_external) != (workspace_id, external):
        also = f", external ID {recorded_external!r}" if external is not None else ""
        raise NoteError(
            f"the bundle is labelled {label}, but its v1 records workspace {recorded}{also}"
        )


def verify_bundle(
    bundle: Mapping[str, Any],
    keyring: Keyring,
    origin: str | None = None,
    held: Sequence[Checkpoint] = (),
) -> BundleReport:
    """Checks a proof bundle with only the keyring: the checkpoint's
    signature, its labels, every event's chain link from version 1, and every
    event the checkpoint covers against its root; then the bundle's checkpoint
    against each checkpoint the auditor holds (``held``, already opened with
    the keyring). Never raises for a bad bundle: the report says which event
    fails and why."""
    if not isinstance(bundle, Mapping):
        return BundleReport("?", None, problem="the file is not a proof bundle (a JSON object)")
    stream = str(bundle.get("stream_id"))
    try:
        if bundle.get("format") != BUNDLE_FORMAT:
            raise NoteError(f"not a {BUNDLE_FORMAT} bundle")
        stream_id = uuid.UUID(stream)
        checkpoint = keyring.open_checkpoint(str(bundle["checkpoint"]), origin)
        label = _check_labels(bundle, stream_id)
    except (NoteError, ValueError, KeyError, TypeError) as error:
        return BundleReport(stream, None, problem=str(error))
    report = BundleReport(stream, checkpoint, label=label)
    previous = GENESIS
    items = bundle.get("events") or []
    claimed: list[bytes] = []
    try:
        if not isinstance(items, list):
            raise ProofError("the bundle's events are not a list")
        redactions = _statements(stream_id, items, keyring)
        for expected, item in enumerate(items, start=1):
            finding, previous = _check_event(
                stream_id, previous, expected, item, checkpoint, redactions
            )
            report.findings.append(finding)
            claimed.append(previous)
        _check_order(items, report.findings)
        _check_redacted(report.findings)
    except (ProofError, ValueError, KeyError, TypeError, binascii.Error) as error:
        report.problem = f"malformed event: {error}"
    if report.problem is None:
        _check_complete(bundle, stream_id, checkpoint, claimed, report)
    if not report.findings and report.problem is None:
        report.problem = "the bundle holds no event"
    report.held = [_against_held(bundle, checkpoint, mine) for mine in held]
    return report


def _check_complete(
    bundle: Mapping[str, Any],
    stream_id: uuid.UUID,
    checkpoint: Checkpoint,
    claimed: list[bytes],
    report: BundleReport,
) -> None:
    """The checkpoint's map of stream heads says which version was the
    stream's last at its size: every event up to it must be here and proven
    (none missing, none passed off as pending), the head's chain hash must be
    the one committed, and nothing after it may claim to be in the log."""
    try:
        root = heads.extension_root(checkpoint.extensions)
        if root is None:
            report.completeness = (
                "completeness not proven: the checkpoint commits no map of"
                " stream heads (signed before kandev-es made one)"
            )
            return
        head = heads.verify_head(stream_id, bundle.get("heads"), root)
    except ProofError as error:
        report.problem = f"stream heads: {error}"
        return
    top = head.version if head else 0
    findings = report.findings
    for position, finding in enumerate(findings):
        version, why = position + 1, ""
        if finding.status == "pending" and version <= top:
            why = f"the checkpoint covers it (the stream's head there is v{top}), yet it is pending"
        elif finding.status == "verified" and version > top:
            why = f"logged before the checkpoint, yet after the stream's head there (v{top})"
        elif version == top and head and claimed[position] != head.chain_hash:
            why = "its chain hash is not the stream's head the checkpoint commits to"
        if why and finding.status != "failed":
            findings[position] = EventFinding(finding.version, finding.event, "failed", why)
    if len(findings) < top:
        report.problem = (
            f"{top - len(findings)} event(s) missing: the checkpoint commits the"
            f" stream's head as v{top}, the bundle ends at v{len(findings)}"
        )
        return
    report.completeness = (
        f"complete: the checkpoint commits the stream's head as v{top};"
        " every event up to it is here"
    )


def _against_held(
    bundle: Mapping[str, Any], theirs: Checkpoint, mine: Checkpoint
) -> tuple[str, bool]:
    """The bundle's checkpoint extends the auditor's (a consistency proof the
    bundle carries), so every event the auditor's covers is proven against it."""
    yours = f"your checkpoint of size {mine.size}"
    if mine.origin != theirs.origin:
        return (
            f"{yours}: FAILED: it is of log {mine.origin!r}, the bundle of {theirs.origin!r}"
        ), False
    if mine.size > theirs.size:
        return (
            f"{yours}: FAILED: the bundle's checkpoint (size {theirs.size}) is older than"
            " yours, so the events yours covers are not all proven: ask for a newer"
            " bundle (a log that shows a smaller tree than one it signed has forked)"
        ), False
    if mine.size == 0:  # every tree extends the empty one: no proof to ask for
        if mine.root != EMPTY_ROOT:
            return f"{yours}: FAILED: its root is not the empty tree's", False
        return f"{yours}: the bundle's checkpoint extends it (the empty tree): OK", True
    try:
        proof = _consistency_from(bundle, mine.size) if mine.size < theirs.size else []
        if mine.size == theirs.size and mine.root != theirs.root:
            raise ProofError("the same size with another root: two different histories")
        if mine.size < theirs.size:
            verify_consistency(mine.size, theirs.size, mine.root, theirs.root, proof)
    except ProofError as error:
        return f"{yours}: FAILED: {error}", False
    return f"{yours}: the bundle's checkpoint extends it: OK", True


def _consistency_from(bundle: Mapping[str, Any], size: int) -> list[bytes]:
    for entry in bundle.get("consistency") or []:
        if isinstance(entry, Mapping) and entry.get("from_size") == size:
            return [decode_hash(p, "consistency proof hash") for p in entry.get("proof") or []]
    raise ProofError(
        f"the bundle carries no consistency proof from size {size}: ask for one"
        f" (kandev-es identity history --proof --consistency-from {size})"
    )


def verify_consistency_bundle(
    bundle: Mapping[str, Any], keyring: Keyring, origin: str | None = None
) -> tuple[Checkpoint, Checkpoint]:
    """Both checkpoints signed by the keyring, and the newer one extends the
    older one (an append-only log: nothing the older covered has changed).
    Raises NoteError or ProofError saying what fails."""
    if bundle.get("format") != CONSISTENCY_FORMAT:
        raise NoteError(f"not a {CONSISTENCY_FORMAT} document")
    for part in ("old", "new"):
        if not isinstance(bundle.get(part), str):
            raise NoteError(f"the document has no {part!r} checkpoint")
    old = keyring.open_checkpoint(bundle["old"], origin)
    new = keyring.open_checkpoint(bundle["new"], origin)
    if old.origin != new.origin:
        raise NoteError("the two checkpoints are of different logs")
    proof = [decode_hash(p, "proof hash") for p in bundle.get("proof") or []]
    verify_consistency(old.size, new.size, old.root, new.root, proof)
    return old, new
