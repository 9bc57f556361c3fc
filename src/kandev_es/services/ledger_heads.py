"""The map of stream heads each checkpoint commits to (docs/auditing.md, "A
bundle is the whole stream"), the server's side: the sequencer brings it to
the log's size in the transaction that signs the checkpoint, a proof bundle
carries a stream's entry and path, and ``audit verify --ledger`` rebuilds it
from the log's leaves to check every signed root. The hashing is the client
distribution's (kandev_es_client.heads), the code the offline verifier runs."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from kandev_es_client import heads
from kandev_es_client.merkle import ProofError
from kandev_es_client.signed_note import Checkpoint, Keyring, NoteError, split_note

from kandev_es.errors import LedgerRefused
from kandev_es.storage import ledger as store
from kandev_es.storage.database import Database

log = logging.getLogger("kandev_es.ledger")

PAGE = 5000


def _latest_heads(tx: Any, start: int, size: int) -> dict[uuid.UUID, tuple[int, bytes]]:
    """Each stream's last (version, chain hash) among leaves start..size-1."""
    latest: dict[uuid.UUID, tuple[int, bytes]] = {}
    after = start - 1
    while after < size - 1:
        page = store.leaves_page(tx, after, min(PAGE, size - 1 - after))
        if not page:
            break
        for _, _, stream, version, value in page:
            key = uuid.UUID(str(stream))
            if version > latest.get(key, (0, b""))[0]:
                latest[key] = (version, value)
        after = page[-1][0]
    return latest


def _nodes_source(tx: Any, backend: str, make: Any) -> heads.MapSource:
    """The stored map nodes ``make`` reads, read in one pass (a first run
    with empty nodes records which: the shape never depends on the hashes)."""
    asked: set[tuple[int, int]] = set()

    def record(level: int, index: int) -> bytes | None:
        asked.add((level, index))
        return None

    make(record)
    found = store.read_map_nodes(tx, backend, asked)
    return lambda level, index: found.get((level, index))


def _changed_since_signed(tx: Any, backend: str, at: int) -> str | None:
    """Why the stored map is not the one the latest checkpoint committed to
    (its tables were changed since), or None. A map at size 0 is rebuilt
    from the log, so it has nothing to check."""
    latest = store.latest_checkpoint(tx)
    if at == 0 or latest is None:
        return None
    text, _ = split_note(latest[1])
    committed = heads.extension_root(text.split("\n")[3:-1])
    if committed is None:
        return None  # signed before maps (or a re-anchor's): nothing to hold it to
    if latest[0] != at:
        return (f"the database's map of stream heads describes the log at size {at}, but the"
                f" latest checkpoint (size {latest[0]}) committed one of its own size")
    if heads.root_of(_nodes_source(tx, backend, heads.root_of)) != committed:
        return (f"the database's map of stream heads is not the one the checkpoint of size {at}"
                " committed to")
    return None


def _check_buckets(
    tx: Any, backend: str, contents: dict[int, list[tuple[uuid.UUID, int, bytes]]]
) -> None:
    """The rows of the buckets about to change still hash to their stored nodes."""
    source = _nodes_source(tx, backend, lambda src: [src(0, b) for b in contents])
    for bucket, entries in contents.items():
        if heads.bucket_hash(heads.Head(*e) for e in entries) != heads.node(source, 0, bucket):
            raise LedgerRefused(f"the database's stream heads of bucket {bucket} are not those"
                                " its map committed to: the ledger_heads table was changed;"
                                " see `kandev-es audit verify --ledger`, then `kandev-es audit"
                                " rebuild-heads`")


def advance(tx: Any, backend: str, size: int) -> bytes | None:
    """In the signing transaction: bring the map to the log at ``size`` and
    return its root; None when another signer already took it past ``size``
    (this checkpoint must then not be signed). LedgerRefused when the map's
    tables were changed since the last checkpoint committed to them: the
    signer never signs a map it did not build from the log."""
    at = store.map_size(tx, backend)
    if at > size:
        return None
    problem = _changed_since_signed(tx, backend, at)
    if problem is not None:
        raise LedgerRefused(f"{problem}: its tables were changed; see `kandev-es audit verify"
                            " --ledger`, then `kandev-es audit rebuild-heads`")
    if at == 0:
        store.clear_map(tx)
    if at < size:
        latest = _latest_heads(tx, at, size)
        if at > 0:
            _check_buckets(tx, backend, store.bucket_heads(
                tx, backend, {heads.bucket_of(s) for s in latest}))
        store.upsert_heads(
            tx, backend,
            [(s, heads.bucket_of(s), v, h) for s, (v, h) in latest.items()],
        )
        contents = store.bucket_heads(tx, backend, {heads.bucket_of(s) for s in latest})
        changed = {b: heads.bucket_hash(heads.Head(*e) for e in entries)
                   for b, entries in contents.items()}

        # The stored nodes updated_nodes reads are siblings of the changed
        # buckets' paths: read those at once (not by a first run of it with
        # empty nodes, which doubled the map's hashing).
        found = store.read_map_nodes(
            tx, backend, {key for bucket in changed for key in heads.siblings(bucket)})
        made = heads.updated_nodes(lambda level, index: found.get((level, index)), changed)
        store.write_map_nodes(tx, backend, [(lv, ix, h) for (lv, ix), h in sorted(made.items())])
        store.set_map_size(tx, size)
    return heads.root_of(_nodes_source(tx, backend, heads.root_of))


def rebuild(database: Database) -> int:
    """``audit rebuild-heads``: the next checkpoint builds the map from the
    log (its size set to 0); the size it described, logged."""
    with database.transaction() as tx:
        at = store.map_size(tx, database.backend)
        store.set_map_size(tx, 0)
    log.warning("ledger: the map of stream heads (at size %d) is to be rebuilt from the log,"
                " by an operator", at)
    return at


def proof(tx: Any, backend: str, stream: uuid.UUID) -> dict[str, Any]:
    """The stream's bucket and the path from it to the map's root, as of
    the map's size (the latest checkpoint's)."""
    bucket = heads.bucket_of(stream)
    entries = sorted((heads.Head(*e) for e in store.bucket_heads(tx, backend, [bucket])[bucket]),
                     key=lambda h: h.stream.bytes)
    source = _nodes_source(tx, backend, lambda src: [heads.node(src, lv, ix)
                                            for lv, ix in heads.siblings(bucket)])
    path = [heads.node(source, lv, ix) for lv, ix in heads.siblings(bucket)]
    return heads.proof_document(entries, path)


class HeadsAudit:
    """``audit verify --ledger``: the map rebuilt from the log's leaves, in
    leaf order, checked against each signed checkpoint's committed root."""

    def __init__(self) -> None:
        self.nodes: dict[tuple[int, int], bytes] = {}
        self.buckets: dict[int, dict[uuid.UUID, heads.Head]] = {}
        self.size = 0

    def _node(self, level: int, index: int) -> bytes | None:
        return self.nodes.get((level, index))

    def _advance(self, leaves: list[tuple[int, int, uuid.UUID, int, bytes]], size: int) -> None:
        changed: set[int] = set()
        for _, _, stream, version, value in leaves[self.size : size]:
            bucket = heads.bucket_of(stream)
            self.buckets.setdefault(bucket, {})[stream] = heads.Head(stream, version, value)
            changed.add(bucket)
        made = heads.updated_nodes(
            self._node, {b: heads.bucket_hash(self.buckets[b].values()) for b in changed})
        self.nodes.update(made)
        self.size = max(self.size, size)

    def problem(
        self, checkpoint: Checkpoint, leaves: list[tuple[int, int, uuid.UUID, int, bytes]]
    ) -> str | None:
        """What is wrong with ``checkpoint``'s map root (checkpoints in size order)."""
        committed = heads.extension_root(checkpoint.extensions)
        if committed is None or checkpoint.size > len(leaves):
            return None
        self._advance(leaves, checkpoint.size)
        if heads.root_of(self._node) != committed:
            return ("its map of stream heads is not the log's: a stream's last event there is"
                    " not the one the checkpoint commits to")
        return None


def signed_map_problems(
    notes: list[tuple[str, str]], keyring: Keyring,
    leaves: list[tuple[int, int, uuid.UUID, int, bytes]],
) -> list[str]:
    """``audit verify --ledger``: each signed checkpoint's map of stream
    heads (where it has one) against the map rebuilt from the log's leaves;
    ``notes`` are (where it came from, note), in size order."""
    audit, problems = HeadsAudit(), []
    for source, note in notes:
        try:
            checkpoint = keyring.open_checkpoint(note)
            problem = audit.problem(checkpoint, leaves)
        except (NoteError, ProofError):
            continue  # a note that does not open is reported by the log's own check
        if problem is not None:
            problems.append(f"{source} (size {checkpoint.size}): {problem}")
    return problems
