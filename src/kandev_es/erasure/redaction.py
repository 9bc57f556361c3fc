"""Forgetting what was written before the upgrade (docs/auditing.md: Erasure).

A task created before free text was sealed (event format 0) holds its title
and description in cleartext events -- its own ``Created``/``Updated``, its
identity's ``Claimed``, a release's stored answer, and the file names of the
uploads it claimed (``Attachment.Uploaded``) -- whose bytes the chains,
the Merkle log and every checkpoint committed to. Forgetting it rewrites
each such event's stored state with those members null (what a sealed event
whose key is gone reads as), and records a **redaction statement** in the
``Forgotten`` events, which are logged and so covered by every later
checkpoint: for each rewritten event its stream, version, the chain hash it
was logged with, and ``redacted_hash`` of its new bytes (never an erased
value), as a note signed by the log's key (kandev_es_client.ledger.
statement_text), so that nobody without the key can make one. The chains
and the log go on standing for the original hashes, so every earlier
checkpoint and proof verifies unchanged; the verifiers check each rewritten
event against the statement (kandev_es_client.ledger.link).

The statement is saved first (with the task's ``Forgotten`` events), the
rewrite follows in a transaction of its own, compare-and-set on the old
bytes: until it commits the events still hash to their logged chain, and a
second forget (a replay) finishes it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass
from typing import Any

from eventsourcing.utils import get_topic
from kandev_es_client import ledger as chains
from kandev_es_client.merkle import ProofError
from kandev_es_client.signed_note import Signer, sign_note

from kandev_es.domain.identity import Identity
from kandev_es.domain.release import release_operation_id
from kandev_es.domain.task import Task
from kandev_es.errors import Contended
from kandev_es.storage import ledger as store
from kandev_es.storage.database import Database
from kandev_es.storage.sealing import SEALED, SEALED_FIELDS

_FORGOTTEN = get_topic(Task.Forgotten)
# The same JSON the library's transcoder reads (compact, UTF-8).
_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


@dataclass(frozen=True)
class Rewrite:
    """One cleartext event and what it becomes."""

    stream: uuid.UUID
    version: int
    topic: str
    old: bytes
    new: bytes


def redacted_state(
    topic: str, state: bytes, owners: Set[uuid.UUID], originator: uuid.UUID
) -> bytes | None:
    """``state`` with the free-text members of ``owners`` (a task, the uploads
    it claimed) null (the paths storage/sealing.py seals), or None when it
    holds none in cleartext (a sealed event, another task's, or one whose
    text is already null)."""
    spec = SEALED_FIELDS.get(topic)
    if spec is None:
        return None
    document = json.loads(state)
    if SEALED in document or _at(document, spec[1], originator) not in owners:
        return None
    changed = False
    for path in spec[0]:
        parent = _parent(document, path)
        if isinstance(parent, dict) and parent.get(path[-1]) is not None:
            parent[path[-1]] = None
            changed = True
    return _ENCODE(document).encode() if changed else None


def _parent(document: Any, path: tuple[str, ...]) -> Any:
    for name in path[:-1]:
        document = document.get(name) if isinstance(document, dict) else None
    return document


def _at(document: Any, path: tuple[str, ...], originator: uuid.UUID) -> uuid.UUID | None:
    """The task an event's free text belongs to (its originator for ``()``)."""
    if not path:
        return originator
    value = _parent(document, path)
    value = value.get(path[-1]) if isinstance(value, dict) else None
    if isinstance(value, dict):  # the transcoder's {"_type_": "uuid", "_data_": hex}
        value = value.get("_data_")
    try:
        return None if value is None else uuid.UUID(str(value))
    except ValueError:
        return None


def streams_of(task_id: uuid.UUID, identity: Identity | None) -> list[uuid.UUID]:
    """The streams that may hold the task's free text: its own, its
    identity's (the plan of each ``Claimed``) and each release operation
    of a tenure that held it (the stored answer)."""
    streams = [task_id]
    if identity is not None:
        streams.append(identity.id)
        for tenure in identity.tenures.values():
            if tenure.task_id == task_id and tenure.release_operation_id:
                streams.append(
                    release_operation_id(identity.workspace_id, tenure.release_operation_id)
                )
    return streams


def rewrites(owners: Set[uuid.UUID], stored: Iterable[Any]) -> list[Rewrite]:
    """The cleartext events among ``stored`` (the library's stored events)
    holding the free text of ``owners``, each with its redacted bytes."""
    found = []
    for event in stored:
        stream = uuid.UUID(str(event.originator_id))
        new = redacted_state(event.topic, event.state, owners, stream)
        if new is not None:
            found.append(Rewrite(stream, event.originator_version, event.topic, event.state, new))
    return found


def named(task_events: Iterable[Any]) -> set[tuple[uuid.UUID, int]]:
    """The (stream, version) the redaction statement of a forgotten task's
    ``Task.Forgotten`` (among its stream's stored events) names: what a
    replayed forget may still rewrite, and nothing else (nothing when it is
    not a statement: the audit names it)."""
    for event in task_events:
        if event.topic == _FORGOTTEN:
            note = json.loads(event.state).get("redactions")
            if not isinstance(note, str):
                return set()
            try:
                return {(e.stream, e.version) for e in chains.statement_entries(note, 0)}
            except ProofError:
                return set()
    return set()


def statement(database: Database, found: Sequence[Rewrite]) -> list[chains.Redaction]:
    """The redaction statement's entries: each event's logged chain hash and
    ``redacted_hash`` of its new bytes from the logged previous hash. Every
    event must be in the log already (its leaf is what the statement keeps
    standing): one not yet sequenced is ``Contended``, retry in a moment."""
    leaves: dict[uuid.UUID, dict[int, tuple[int, bytes]]] = {}
    with database.transaction() as tx:
        for stream in {rewrite.stream for rewrite in found}:
            leaves[stream] = store.stream_leaves(tx, database.backend, stream)
    entries = []
    for rewrite in found:
        logged = leaves[rewrite.stream]
        own = logged.get(rewrite.version)
        previous = (
            chains.GENESIS
            if rewrite.version == 1
            else logged.get(rewrite.version - 1, (0, None))[1]
        )
        if own is None or previous is None:
            raise Contended(
                "this task's events are not all in the ledger yet; retry in a few seconds"
                " with the same Idempotency-Key"
            )
        new = chains.redacted_hash(
            rewrite.stream, rewrite.version, previous, rewrite.topic, rewrite.new
        )
        entries.append(chains.Redaction(rewrite.stream, rewrite.version, own[1], new, 0))
    return entries


def signed(signer: Signer, task_id: uuid.UUID, entries: Sequence[chains.Redaction]) -> str:
    """The statement as a note signed by the log's key (its name: the origin)."""
    return sign_note(chains.statement_text(signer.name, task_id, entries), signer)


def apply(database: Database, table: str, found: Sequence[Rewrite]) -> int:
    """Rewrite the events in one transaction, each only if it still holds
    its old bytes (a second run changes nothing); how many changed."""
    changed = 0
    with database.transaction() as tx:
        for rewrite in found:
            key = store.stream_key(database.backend, rewrite.stream)
            done = tx.execute(
                f"UPDATE {table} SET state = ? WHERE originator_id = ?"
                " AND originator_version = ? AND state = ? RETURNING 1",
                (rewrite.new, key, rewrite.version, rewrite.old),
            )
            changed += len(list(done))
    return changed
