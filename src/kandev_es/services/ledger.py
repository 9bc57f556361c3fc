"""Tamper-evident history, the server's side (docs/auditing.md): the
sequencer that appends every event's chain hash to the Merkle log in settled
global order and signs checkpoints, the signing key, and the proofs an
auditor downloads. The hashing, the tree and the note formats are the client
distribution's (kandev_es_client), the very code the offline verifier runs.

One sequencer per database does the work (the same leadership as the
projection loop, on a lock of its own); any process may serve proofs."""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from kandev_es_client import heads, merkle
from kandev_es_client import ledger as chains
from kandev_es_client.signed_note import (
    Checkpoint,
    Keyring,
    KeyringEntry,
    NoteError,
    Signer,
    parse_checkpoint,
    sign_note,
    split_note,
)

from kandev_es import loops, metrics
from kandev_es.application import Tasks
from kandev_es.config import Settings
from kandev_es.domain.external_id import identity_id
from kandev_es.errors import (
    CheckpointNotFound,
    IdentityNotFound,
    InternalError,
    InvalidCheckpointRange,
    LedgerRefused,
    TaskNotFound,
)
from kandev_es.observability import tracing
from kandev_es.projections.leadership import make_leadership
from kandev_es.services import ledger_heads
from kandev_es.services import ledger_keys as keys
from kandev_es.services.ledger_witness import Witnesses
from kandev_es.storage import ledger as store
from kandev_es.storage.database import Database

log = logging.getLogger("kandev_es.ledger")
BATCH = 2000
# A pass appends what settled since the last one and, when due, signs a
# checkpoint, in one write transaction: at most two a second under load
# (a pass of its own only for a full BATCH), none while nothing is saved. A
# checkpoint still follows an event within about ledger_checkpoint_seconds
# plus this.
SEQUENCE_SECONDS = 0.5
RETRY_SECONDS = 1.0
# A refusing sequencer looks again this often (a re-anchor or a rotated key
# lets it go on); a process that does not sequence checks this often for /readyz.
REFUSED_SECONDS = 5.0
HEALTH_SECONDS = 5.0
# The sequencer's advisory lock class ("kes2"), apart from the projection leader's.
LOCK_CLASS = int.from_bytes(b"kes2", "big")
TASK_TOPIC = "kandev_es.domain.task:Task."


class LedgerBroken(InternalError):
    """History below the settled position cannot be chained (an event the
    stream needs is gone): the sequencer stops rather than sign over it."""


def load_signer(settings: Settings) -> Signer:
    """The checkpoint signing key (services/ledger_keys.py): LedgerRefused
    when it is missing, unreadable or readable by others."""
    return keys.read_signer(keys.key_files(settings))


def keyring_of(signer: Signer) -> Keyring:
    return Keyring([KeyringEntry(signer.verifier)])


class Sequencer:
    def __init__(self, app: Tasks, database: Database, settings: Settings) -> None:
        self.app = app
        self.database = database
        self.settings = settings
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._signer: Signer | None = None
        self._last_signed = time.monotonic()
        # What this process knows of the log (run_once, checkpoint_if_due): the
        # notification id up to which every event is in it (-1: not read
        # yet), its size after the last append and at the last checkpoint
        # (None: not read yet), so idle passes read and write nothing.
        self._sequenced = -1
        self._size: int | None = None
        self._signed_size = 0
        self._files = keys.key_files(settings)
        self._key_stamp: tuple[int, int] | None = None
        # Why signing is refused (None: it is not), as the sequencing thread
        # last found or as health() last checked, and when health() checked.
        self.refused: str | None = None
        self._seen: str | None = None
        self._checked = float("-inf")
        self.witnesses = Witnesses(settings.ledger_witness_urls)

    @property
    def signer(self) -> Signer:
        """The key as its file is now: read again when the file changed (a
        rotation), LedgerRefused when it is gone or unreadable."""
        try:
            found = self._files.key.stat()
            stamp = (found.st_ino, found.st_mtime_ns)
        except OSError:
            stamp = None
        if self._signer is None or stamp is None or stamp != self._key_stamp:
            self._signer = None
            self._signer = load_signer(self.settings)
            self._key_stamp = stamp
        return self._signer

    def run_once(self, sign: bool = True) -> int:
        """Append the settled events not yet in the log, and sign a checkpoint
        in the same transaction when one is due (and ``sign``: ``audit
        reanchor`` appends only); the number appended. A pass
        that finds the head where the last one left the log reads nothing
        more and writes nothing."""
        recorder = cast(Any, self.app.recorder)  # ours, on both backends (storage/)
        head = recorder.checkpoint()  # before the settled read (storage/settled.py)
        if head <= self._sequenced:
            return 0
        with self.database.transaction() as tx:
            size, after = store.tree_head(tx)
        settled = recorder.read_settled(after, BATCH)
        notifications = settled.notifications
        if not notifications:
            self._sequenced = max(after, settled.position)
            return 0
        # The one span of a pass that appends (a pass that only looked made none).
        with (
            tracing.span("ledger sequence", **{"kandev.events": len(notifications)}),
            self.database.transaction() as tx,
        ):
            if store.tree_head(tx) != (size, after):
                return 0  # another sequencer moved on meanwhile
            with tracing.span("append"):
                self._append(tx, size, notifications)
            with tracing.span("sign if due"):
                note = self._sign_if_due(tx, size + len(notifications)) if sign else None
                tracing.note(**{"kandev.signed": note is not None})
        self._anchored(note)
        metrics.record_background_write("ledger")
        self._size = size + len(notifications)
        full = len(notifications) >= BATCH
        self._sequenced = notifications[-1].id if full else max(settled.position,
                                                                  notifications[-1].id)
        return len(notifications)

    def _append(self, tx: Any, size: int, notifications: list[Any]) -> None:
        backend = self.database.backend
        nodes = store.read_nodes(tx, store.frontier_keys(size))
        known = store.previous_hashes(
            tx, backend,
            [(n.originator_id, n.originator_version - 1) for n in notifications
             if n.originator_version > 1],
        )
        leaves, made = [], []
        for n in notifications:
            version = n.originator_version
            previous = chains.GENESIS if version == 1 else known.get((n.originator_id, version - 1))
            if previous is None:
                raise LedgerBroken(
                    f"stream {n.originator_id} version {version - 1} is not in the log"
                    f" (event {n.id} cannot be chained)"
                )
            value = chains.chain_hash(n.originator_id, version, previous, n.topic, n.state)
            known[(n.originator_id, version)] = value
            try:
                new = merkle.appended_nodes(lambda lv, ix: nodes[(lv, ix)], size, value)
            except KeyError as missing:
                raise LedgerRefused(_missing(missing)) from None
            nodes.update({(lv, ix): h for lv, ix, h in new})
            made.extend(new)
            leaves.append((size, n.id, n.originator_id, version, value))
            size += 1
        store.append(tx, backend, leaves, made)

    def checkpoint_if_due(self, force: bool = False) -> str | None:
        """Sign a checkpoint of the whole log when enough time or events
        passed since the last one (or ``force``); the new note, or None.
        Reads nothing while this process knows the log has not grown since
        the last checkpoint it saw."""
        if not force and self._size is not None and self._size <= self._signed_size:
            return None
        with self.database.transaction() as tx:
            size, _ = store.tree_head(tx)
            note = self._sign_if_due(tx, size, force)
        self._anchored(note)
        if note is not None:
            metrics.record_background_write("ledger")
        return note

    def _sign_if_due(self, tx: Any, size: int, force: bool = False) -> str | None:
        """In ``tx``: a signed checkpoint of the log at ``size`` if one is due;
        LedgerRefused, nothing signed, when the log is not a consistent
        extension of the anchor (the last checkpoint this host signed) or the
        key is gone. The caller keeps the note as the anchor once ``tx`` commits."""
        last = store.latest_checkpoint(tx)
        last_size = last[0] if last else -1
        self._size, self._signed_size = size, max(last_size, 0)
        if size <= last_size:
            return None
        waited = time.monotonic() - self._last_signed
        due = size - max(last_size, 0) >= self.settings.ledger_checkpoint_events
        if not (force or due or waited >= self.settings.ledger_checkpoint_seconds):
            return None
        root = root_at(tx, size)
        problem = self.anchor_problem(tx, size, root)
        if problem is not None:
            raise LedgerRefused(problem)
        note = self._signed(tx, size, root)
        if note is None:
            return None  # another signer's map is past this size
        store.add_checkpoint(tx, size, note, time.time())
        self._last_signed = time.monotonic()
        self._signed_size = size
        return note

    def _signed(self, tx: Any, size: int, root: bytes) -> str | None:
        """In ``tx``: the map of stream heads brought to ``size`` and the
        checkpoint of the log at ``size`` signed with its root (None: another
        signer's map is past this size)."""
        map_root = ledger_heads.advance(tx, self.database.backend, size)
        if map_root is None:
            return None
        signer = self.signer
        problem = keys.window_problem(self._files, signer, size)
        if problem is not None:
            raise LedgerRefused(problem)
        checkpoint = Checkpoint(signer.name, size, root, (heads.extension_line(map_root),))
        return sign_note(checkpoint.text(), signer)

    def anchor_problem(self, tx: Any, size: int, root: bytes) -> str | None:
        """Why the log at ``size`` with ``root`` (as ``tx`` reads its nodes) is
        not a consistent extension of the anchor; None when it is (or when
        this host never signed)."""
        try:
            anchor = keys.read_anchor(self._files)
        except (OSError, UnicodeDecodeError, NoteError) as error:
            return f"the signer's anchor {self._files.anchor} cannot be read ({error})"
        if anchor is None:
            return None
        return extension_problem(tx, anchor, size, root)

    def _anchored(self, note: str | None) -> None:
        """After the commit that stored ``note``: it is the new anchor, and
        the witnesses are asked to cosign it."""
        if note is not None:
            keys.write_anchor(self._files, note)
            self._witnessed(note)

    def _witnessed(self, note: str) -> None:
        """The witnesses' cosignatures of ``note``, added to its stored copy:
        asked outside any transaction (a witness may take seconds; an open
        transaction would hold every settled reader of the cluster meanwhile),
        the proof read in a short one of its own."""
        if not self.witnesses.urls:
            return
        size = parse_checkpoint(split_note(note)[0]).size

        def prove(old_size: int) -> list[bytes]:
            with self.database.transaction() as tx:
                return consistency_hashes(tx, old_size, size)

        cosigned = self.witnesses.cosign(note, size, prove)
        if cosigned != note:
            with self.database.transaction() as tx:
                store.replace_note(tx, size, note, cosigned)

    def fill_chains(self) -> None:
        """db init: the events stored before their save wrote chain hashes get them."""
        with self.database.transaction() as tx:
            store.fill_chain_column(tx, self.database.backend,
                                    self.app.recorder.events_table_name)  # type: ignore[attr-defined]

    def catch_up(self) -> str | None:
        """Sequence everything settled and sign a checkpoint of it (``db
        init``'s backfill, tests, ``audit checkpoint --now``): the note of the
        checkpoint of the whole log (signed by a pass when one was due), None
        while the log is empty."""
        while self.run_once():
            pass
        note = self.checkpoint_if_due(force=True)
        if note is None:
            with self.database.transaction() as tx:
                last = store.latest_checkpoint(tx)
            note = None if last is None else last[1]
        return note

    def run_forever(self) -> None:
        leadership = make_leadership(self.database, "ledger", LOCK_CLASS)
        try:
            while not self._stop.is_set():
                if not leadership.hold():
                    self._stop.wait(RETRY_SECONDS)
                    continue
                try:
                    appended = self.run_once()
                    self.checkpoint_if_due()
                    self.refusal(None)
                except LedgerRefused as error:
                    self.refusal(error.message)
                    self._stop.wait(REFUSED_SECONDS)
                    continue
                except LedgerBroken as error:
                    log.error("ledger: sequencer stopped: %s", error)
                    return
                except Exception as error:  # the database went away: try again later
                    log.warning("ledger: sequencer pass failed (%s); retrying", error)
                    appended = 0
                    self._stop.wait(RETRY_SECONDS)
                if appended < BATCH:
                    self._stop.wait(SEQUENCE_SECONDS)
        finally:
            if self.refused is not None:  # what health() finds from now on
                metrics.ledger_signing_refused(False)
                self.refused = None
            leadership.release()

    def refusal(self, problem: str | None) -> None:
        """The sequencing thread's finding: signing is refused for
        ``problem`` (None: it is not). An ERROR line when a refusal starts or
        changes, a WARNING when it ends; each refused pass is counted."""
        if problem is not None:
            metrics.record_ledger_refusal()
        if problem == self.refused:
            return
        if problem is not None:
            log.error("ledger: REFUSED to sign a checkpoint: %s", problem)
        else:
            log.warning("ledger: signing checkpoints again (the refusal ended)")
        metrics.ledger_signing_refused(problem is not None)
        self.refused = problem

    def health(self) -> str | None:
        """Why this deployment's checkpoints are not being signed (/readyz),
        None when nothing stops them: the sequencing thread's finding, or its
        own look at the key and at the log against the anchor (a process that
        does not sequence), at most every HEALTH_SECONDS."""
        if self.refused is not None:
            return self.refused
        if time.monotonic() - self._checked >= HEALTH_SECONDS:
            self._checked = time.monotonic()
            self._seen = keys.read_signer_problem(self._files) or self._log_problem()
        return self._seen

    def _log_problem(self) -> str | None:
        """The log against the anchor, and the key against the keyring's
        windows: what the sequencer would refuse, seen by a process that does
        not sequence (the web workers beside the background process)."""
        with self.database.transaction() as tx:
            size, _ = store.tree_head(tx)
            try:
                root = root_at(tx, size)
            except LedgerRefused as error:
                return error.message
            problem = self.anchor_problem(tx, size, root)
        if problem is not None:
            return problem
        try:
            return keys.window_problem(self._files, keys.read_signer(self._files), size)
        except LedgerRefused as error:  # the key went meanwhile
            return error.message

    def reanchor(self, reason: str) -> str | None:
        """``audit reanchor``, after a real restore: the log as the database
        now holds it (every settled event appended) becomes the anchor, and a
        signed statement naming the old and the new root says so; it is kept
        beside the key, logged, and returned for the operator to publish.
        None, changing nothing, when the log extends the anchor (no fork)."""
        signer = self.signer
        anchor = keys.read_anchor(self._files)
        while self.run_once(sign=False):
            pass
        with self.database.transaction() as tx:
            size, _ = store.tree_head(tx)
            root = root_at(tx, size)
            if anchor is None or self.anchor_problem(tx, size, root) is None:
                return None
            note = self._signed(tx, size, root)
            if note is None:
                raise LedgerRefused("the database's map of stream heads is past its log:"
                                    " run `kandev-es audit verify --ledger`")
            stored = store.checkpoint_at(tx, size)
            if stored is not None and checkpoint_root(stored) != root:
                raise LedgerRefused(f"the database's own checkpoint of size {size} does not"
                                    " match its log: it is not a restore to re-anchor to")
            if stored is None and size > 0:
                store.add_checkpoint(tx, size, note, time.time())
            statement = sign_note(reanchor_text(signer.name, anchor, size, root, reason), signer)
            # What audit verify --ledger explains a fork by.
            store.add_reanchor(tx, self.database.backend, statement, time.time())
        keys.append_statement(self._files, statement)
        keys.write_anchor(self._files, note, force=True)
        log.warning("ledger: RE-ANCHORED by an operator (%s): from size %d root %s to size %d"
                    " root %s", reason, anchor.size, _b64(anchor.root), size, _b64(root))
        return statement

    def start_thread(self) -> threading.Thread:
        self._stop.clear()
        return loops.start(self.run_forever, "ledger", self._threads)

    def stop(self) -> None:
        """Stop the loop and wait for it: the store may be closed after."""
        loops.stop(self._stop, self._threads)


def _missing(key: KeyError) -> str:
    return (f"node {key} of the log's tree is missing from the database: its history was"
            " tampered with; nothing is signed over it")


def root_at(tx: Any, size: int) -> bytes:
    """The root of the log at ``size`` from the nodes ``tx`` reads;
    LedgerRefused when one is missing."""
    nodes = store.read_nodes(tx, store.frontier_keys(size))
    try:
        return merkle.root_hash(lambda lv, ix: nodes[(lv, ix)], size)
    except KeyError as missing:
        raise LedgerRefused(_missing(missing)) from None


def extension_problem(tx: Any, anchor: Checkpoint, size: int, root: bytes) -> str | None:
    """Why the log at ``size`` with ``root`` does not extend ``anchor``
    (RFC 9162 consistency, its proof built from the nodes ``tx`` reads)."""
    where = f"the last checkpoint this host signed (size {anchor.size}, root {_b64(anchor.root)})"
    if size < anchor.size:
        return (f"the log in the database holds {size} events, fewer than {where}: it was"
                " cut, emptied or restored from a backup; if it was restored on purpose,"
                " see `kandev-es audit reanchor` (docs/operations.md)")
    if anchor.size == 0:
        return None
    old_size = anchor.size

    def make(source: merkle.NodeSource) -> list[bytes]:
        return merkle.consistency_proof(source, old_size, size)

    try:
        proof = make(_read_needed(tx, make))
        merkle.verify_consistency(old_size, size, anchor.root, root, proof)
    except (KeyError, merkle.ProofError) as error:
        reason = "a node of the tree is missing" if isinstance(error, KeyError) else error
        return (f"the log in the database (size {size}, root {_b64(root)}) is not a consistent"
                f" extension of {where} ({reason}): its history was rewritten or restored"
                " from a backup; if it was restored on purpose, see `kandev-es audit"
                " reanchor` (docs/operations.md)")
    return None


def reanchor_text(origin: str, old: Checkpoint, size: int, root: bytes, reason: str) -> str:
    """A re-anchor statement's note text: not a checkpoint (its second line
    is no size), so no verifier takes it for one."""
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    said = " ".join("".join(c if c.isprintable() else " " for c in reason).split())
    return (f"{origin}\nkandev-es re-anchor\nold {old.size} {_b64(old.root)}\n"
            f"new {size} {_b64(root)}\nat {when}\nreason {said or '-'}\n")


def checkpoint_root(note: str) -> bytes:
    return parse_checkpoint(split_note(note)[0]).root


def rotate_key(database: Database, settings: Settings) -> Keyring:
    """``audit rotate-key``: a new key signs from one above the largest
    checkpoint signed so far (the anchor's, or the store's own); the keyring
    beside the key records every key's window. Logged."""
    files = keys.key_files(settings)
    try:
        anchor = keys.read_anchor(files)
    except (OSError, UnicodeDecodeError, NoteError):
        anchor = None
    with database.transaction() as tx:
        latest = store.latest_checkpoint(tx)
    signed = max(anchor.size if anchor else 0, latest[0] if latest else 0)
    ring, signer = keys.rotate(settings, signed)
    log.warning("ledger: KEY ROTATED by an operator: the old key's window ends at size %d,"
                " %s signs from %d", signed, signer.verifier.vkey(), signed + 1)
    return ring


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def _read_needed(tx: Any, make: Callable[[merkle.NodeSource], object]) -> merkle.NodeSource:
    """The nodes ``make`` asks for, read in one query: a first run with
    placeholder hashes records which (a proof's shape never depends on them)."""
    asked: set[tuple[int, int]] = set()

    def record(level: int, index: int) -> bytes:
        asked.add((level, index))
        return bytes(32)

    make(record)
    nodes = store.read_nodes(tx, asked)
    return lambda level, index: nodes[(level, index)]


def _proofs(tx: Any, wanted: list[tuple[int, int]], size: int) -> dict[int, list[bytes]]:
    """Inclusion proofs of leaf indexes at ``size``, their nodes read at once."""

    def all_proofs(source: merkle.NodeSource) -> dict[int, list[bytes]]:
        return {index: merkle.inclusion_proof(source, index, size) for _, index in wanted}

    return all_proofs(_read_needed(tx, all_proofs))


def _consistency_proofs(tx: Any, sizes: Sequence[int], size: int) -> list[dict[str, Any]]:
    """Consistency proofs from each of ``sizes`` (the auditor's checkpoints)
    to ``size``; a size above it gets none (the verifier says why)."""
    wanted = sorted({s for s in sizes if 0 < s < size})

    def make(source: merkle.NodeSource) -> list[list[bytes]]:
        return [merkle.consistency_proof(source, old, size) for old in wanted]

    proofs = make(_read_needed(tx, make)) if wanted else []
    return [{"from_size": old, "proof": [_b64(p) for p in proof]}
            for old, proof in zip(wanted, proofs, strict=True)]


def proof_bundle(
    app: Tasks, database: Database, workspace_id: uuid.UUID, external_id: str,
    consistency_from: Sequence[int] = (),
) -> dict[str, Any]:
    """The identity's events as stored, their chain and their inclusion
    proofs against the latest checkpoint, and a consistency proof to it from
    each of ``consistency_from`` (sizes of checkpoints the auditor holds);
    kandev_es_client.ledger checks it."""
    key = identity_id(workspace_id, external_id)
    stored = list(app.recorder.select_events(key))
    if not stored:
        raise IdentityNotFound("identity not found")
    labels = {"workspace_id": str(workspace_id), "external_id": external_id}
    return _stream_bundle(database, key, stored, labels, consistency_from)


def task_proof_bundle(
    app: Tasks, database: Database, task_id: uuid.UUID, consistency_from: Sequence[int] = ()
) -> dict[str, Any]:
    """A task stream's proof bundle (``audit task-proof``): the same checks
    as an identity's, labelled with the task's workspace and id."""
    stored = list(app.recorder.select_events(task_id))
    if not stored or not stored[0].topic.startswith(TASK_TOPIC):
        raise TaskNotFound("task not found")
    workspace = json.loads(stored[0].state)["workspace_id"]["_data_"]
    labels = {"workspace_id": str(uuid.UUID(workspace)), "task_id": str(task_id)}
    return _stream_bundle(database, task_id, stored, labels, consistency_from)


def _stream_bundle(
    database: Database, key: uuid.UUID, stored: list[Any], labels: dict[str, str],
    consistency_from: Sequence[int],
) -> dict[str, Any]:
    for _ in range(3):  # a checkpoint signed between the reads: read again
        with database.transaction() as tx:
            latest = store.latest_checkpoint(tx)
            if latest is None:
                raise CheckpointNotFound("no checkpoint signed yet: the ledger has not caught up")
            size, note, _ = latest
            logged = store.stream_leaves(tx, database.backend, key)
            covered = [(v, i) for v, (i, _) in logged.items() if i < size]
            proofs = _proofs(tx, covered, size)
            consistency = _consistency_proofs(tx, consistency_from, size)
            map_proof = ledger_heads.proof(tx, database.backend, key)
        if _map_matches(note, key, map_proof):
            break
    events, previous = [], chains.GENESIS
    for event in stored:
        version = event.originator_version
        leaf = logged.get(version)
        value = leaf[1] if leaf else chains.chain_hash(
            key, version, previous, event.topic, event.state)
        previous = value
        events.append({
            "version": version, "event": chains.event_name(event.topic), "topic": event.topic,
            "state": _b64(event.state), "hash": _b64(value),
            "leaf_index": leaf[0] if leaf else None,
            "inclusion": [_b64(p) for p in proofs.get(leaf[0], [])] if leaf else [],
        })
    return {"format": chains.BUNDLE_FORMAT, "stream_id": str(key), **labels,
            "checkpoint": note, "events": events, "consistency": consistency,
            "heads": map_proof}


def _map_matches(note: str, stream: uuid.UUID, proof: dict[str, Any]) -> bool:
    """The map proof leads to the root ``note`` commits to (or it commits none)."""
    text, _ = split_note(note)
    committed = heads.extension_root(text.split("\n")[3:-1])
    if committed is None:
        return True
    try:
        heads.verify_head(stream, proof, committed)
    except merkle.ProofError:
        return False
    return True


def identity_verification(
    app: Tasks, database: Database, settings: Settings, workspace_id: uuid.UUID,
    external_id: str,
) -> dict[str, Any]:
    """The auditor's page's line: do the identity's events verify up to the
    latest checkpoint (its proof bundle checked by the verifier's own code)."""
    try:
        bundle = proof_bundle(app, database, workspace_id, external_id)
        ring = keys.load_keyring(settings)
    except (CheckpointNotFound, LedgerRefused, NoteError, OSError):
        return {"state": "unchecked", "summary": "no signed checkpoint yet", "lines": []}
    report = chains.verify_bundle(bundle, ring)
    statuses = [f.status for f in report.findings]
    state = ("failed" if not report.ok
             else "pending" if "pending" in statuses else "verified")
    size = report.checkpoint.size if report.checkpoint else 0
    summary = {
        "failed": f"FAILED against the checkpoint of size {size}",
        "pending": f"{statuses.count('verified')} event(s) verified up to the checkpoint of"
        f" size {size}; {statuses.count('pending')} written after it",
        "verified": f"all {len(statuses)} events verified up to the checkpoint of size {size}",
    }[state]
    return {"state": state, "summary": summary, "lines": report.lines()[1:-1]}


def latest_checkpoint(database: Database) -> str:
    with database.transaction() as tx:
        latest = store.latest_checkpoint(tx)
    if latest is None:
        raise CheckpointNotFound("no checkpoint signed yet: the ledger has not caught up")
    return latest[1]


def consistency_hashes(tx: Any, old_size: int, new_size: int) -> list[bytes]:
    """An RFC 9162 consistency proof between two sizes of the log, from the
    nodes ``tx`` reads."""

    def make(source: merkle.NodeSource) -> list[bytes]:
        return merkle.consistency_proof(source, old_size, new_size)

    return make(_read_needed(tx, make))


def signed_checkpoints(
    database: Database, after: int = 0, limit: int = 50, newest: bool = True
) -> list[dict[str, Any]]:
    """The signed checkpoints an auditor may ask consistency proofs between
    (``audit checkpoints``): size, when signed, origin, root and the note."""
    with database.transaction() as tx:
        rows = store.checkpoints_page(tx, after, limit, newest)
    listed = []
    for size, note, signed_at in rows:
        text, _ = split_note(note)
        origin, _, root = text.split("\n")[:3]
        listed.append({"size": size, "signed_at": signed_at, "origin": origin, "root": root,
                       "note": note})
    return listed


def consistency(database: Database, old_size: int, new_size: int | None) -> dict[str, Any]:
    """A consistency proof between two signed checkpoints (the newest when
    ``new_size`` is None)."""
    with database.transaction() as tx:
        if new_size is None:
            latest = store.latest_checkpoint(tx)
            new_size = latest[0] if latest else 0
        old, new = store.checkpoint_at(tx, old_size), store.checkpoint_at(tx, new_size)
        if old is None or new is None:
            raise CheckpointNotFound("no signed checkpoint of that size")
        if not 0 < old_size <= new_size:
            raise InvalidCheckpointRange("from must be above 0 and at most to")
        size = new_size

        def make(source: merkle.NodeSource) -> list[bytes]:
            return merkle.consistency_proof(source, old_size, size)

        proof = make(_read_needed(tx, make))
    return {"format": chains.CONSISTENCY_FORMAT, "old": old, "new": new,
            "proof": [_b64(p) for p in proof]}


def checkpoint_origin(note: str) -> str:
    text, _ = split_note(note)
    return text.split("\n", 1)[0]


def key_file_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777
