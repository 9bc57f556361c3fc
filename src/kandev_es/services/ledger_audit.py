"""``kandev-es audit verify --ledger``: recompute every stream's chain and the
Merkle log from the events as stored, and check them against the log's
leaves and against signed checkpoints (the store's own and one the auditor
kept outside). Each problem names the stream and version it concerns.

What each check catches (docs/auditing.md, "Threat model"):
- an event's bytes edited: its chain link no longer matches its logged leaf;
- an event deleted, or two versions swapped: the leaf's event is gone or is
  another one, and the stream's versions have a gap;
- a tail cut or a whole stream deleted: leaves whose events are gone;
- two events' stored positions swapped (leaves re-pointed): the store's
  order is no longer the log's leaf order;
- an event stored under another spelling of its stream id (SQLite text):
  not the id the application looks up, byte for byte;
- an attacker who also rewrote the leaves and the tree: the root recomputed
  from the events differs from a signed checkpoint's, and the checkpoints
  the store still holds bound where (the first event after the last one that
  matches is named, and the events up to the one that fails are listed).

An event written before the upgrade and rewritten by a forget stands for the
chain hash its redaction statement names when its remaining bytes, topic
and place are the ones the statement records (kandev_es_client.ledger.link,
erasure/redaction.py); the statement must be logged under a signed
checkpoint, and an event it names that still holds its cleartext is named.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from kandev_es_client import ledger as chains
from kandev_es_client import merkle
from kandev_es_client.signed_note import Checkpoint, Keyring, NoteError, open_note

from kandev_es.application import Tasks
from kandev_es.services.ledger_forgotten import FORGOTTEN, ForgottenTask, forgotten_tasks
from kandev_es.services.ledger_heads import signed_map_problems
from kandev_es.storage import ledger as store
from kandev_es.storage.database import Database

BATCH = 5000
# A leaf of the log: (index, notification id, stream, version, chain hash).
Leaf = tuple[int, int, uuid.UUID, int, bytes]
WINDOW_LISTED = 20


@dataclass(frozen=True)
class Problem:
    stream: str | None
    version: int | None
    problem: str

    def line(self) -> str:
        where = f"stream {self.stream} version {self.version}: " if self.stream else ""
        return where + self.problem


@dataclass
class LedgerReport:
    events: int = 0
    leaves: int = 0
    checkpoints: int = 0
    problems: list[Problem] = field(default_factory=list)
    # The operators' re-anchor statements that verify (audit reanchor): what
    # explains a checkpoint of the history before a restore failing here.
    reanchors: list[str] = field(default_factory=list)
    # The forgotten tasks (services/ledger_forgotten.py), each consistent or not.
    forgotten: list[ForgottenTask] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "events": self.events, "leaves": self.leaves,
                "checkpoints": self.checkpoints,
                "problems": [p.__dict__ for p in self.problems], "reanchors": self.reanchors,
                "forgotten": [{**f.__dict__, "events": [list(e) for e in f.events]}
                              for f in self.forgotten]}


@dataclass(frozen=True)
class _Event:
    position: int
    stream: uuid.UUID
    version: int
    topic: str
    state: bytes


def _events(app: Tasks) -> list[_Event]:
    found: list[_Event] = []
    start = 0
    while True:
        batch = app.recorder.select_notifications(start=start, limit=BATCH,
                                                  inclusive_of_start=False)
        if not batch:
            return found
        found.extend(_Event(n.id, uuid.UUID(str(n.originator_id)), n.originator_version,
                            n.topic, n.state)
                     for n in batch)
        start = batch[-1].id


def _leaves(database: Database, report: LedgerReport) -> list[Leaf]:
    """The log's leaves in order; a leaf whose stream id is not stored as the
    application reads it (canonical form, byte for byte) is a problem."""
    found: list[Leaf] = []
    backend = database.backend
    with database.transaction() as tx:
        while True:
            page = store.leaves_page(tx, found[-1][0] if found else -1, BATCH)
            if not page:
                return found
            for i, n, raw, v, h in page:
                stream = uuid.UUID(str(raw))
                if raw != store.stream_key(backend, stream):
                    report.problems.append(Problem(str(stream), v, f"leaf {i} names its"
                                                   f" stream as {raw!r}, not in canonical form"))
                found.append((i, n, stream, v, h))


def _check_stream_ids(events: list[_Event], stored: dict[int, Any], backend: str,
                      report: LedgerReport) -> None:
    """Each event's stream id as stored, byte for byte, against the form the
    application looks streams up by: an event stored under another spelling
    of its stream's id (upper-cased hex on SQLite) is invisible to the
    application (a release lost from the identity's history), though the
    same stream to a UUID parser."""
    for event in events:
        raw = stored.get(event.position)
        canonical = store.stream_key(backend, event.stream)
        if raw is not None and raw != canonical:
            report.problems.append(Problem(
                str(event.stream), event.version,
                f"stored under the stream id {raw!r} (position {event.position}), not"
                f" {str(canonical)!r}: the application looks a stream up by its exact id"
                " and does not see this event"))


Redactions = dict[tuple[uuid.UUID, int], chains.Redaction]


def _redactions(events: list[_Event], leaves: list[Leaf], report: LedgerReport,
                keyring: Keyring) -> Redactions:
    """The redaction statements of the ``Forgotten`` events, by the event
    each entry names (its ``statement``: the Forgotten event's position);
    one not signed by a key of the keyring whose window covers its place in
    the log is a problem, and names nothing."""
    index = {n: i for i, n, _, _, _ in leaves}
    found: Redactions = {}
    for event in events:
        if chains.event_name(event.topic) != "Forgotten":
            continue
        try:
            leaf = index.get(event.position)
            size = None if leaf is None else leaf + 1
            entries = chains.redactions_in(event.state, event.position, keyring, size)
        except merkle.ProofError as error:
            report.problems.append(Problem(str(event.stream), event.version, str(error)))
            continue
        for entry in entries:
            kept = found.setdefault((entry.stream, entry.version), entry)
            if (kept.original, kept.redacted) != (entry.original, entry.redacted):
                report.problems.append(Problem(str(entry.stream), entry.version,
                                               "two redaction statements differ on it"))
    return found


def _link(event: _Event, previous: bytes, redactions: Redactions) -> bytes:
    return chains.link(event.stream, event.version, previous, event.topic, event.state,
                       redactions.get((event.stream, event.version)))[0]


def _chains(events: list[_Event], report: LedgerReport,
            redactions: Redactions) -> dict[tuple[uuid.UUID, int], bytes]:
    """Every stream's chain recomputed from genesis, and its version gaps."""
    last: dict[uuid.UUID, tuple[int, bytes]] = {}
    computed: dict[tuple[uuid.UUID, int], bytes] = {}
    for event in sorted(events, key=lambda e: (str(e.stream), e.version)):
        version, previous = last.get(event.stream, (0, chains.GENESIS))
        if event.version != version + 1:
            report.problems.append(Problem(
                str(event.stream), event.version,
                f"follows version {version}: an event is missing or versions were swapped"))
        value = _link(event, previous, redactions)
        computed[(event.stream, event.version)] = value
        last[event.stream] = (event.version, value)
    return computed


def _check_leaf(
    leaf: tuple[int, int, uuid.UUID, int, bytes], by_position: dict[int, _Event],
    logged: dict[tuple[uuid.UUID, int], bytes], report: LedgerReport, redactions: Redactions,
) -> None:
    """One leaf against the event it logged: still there, still the same
    stream and version, still the same bytes (its link from the logged previous)."""
    index, position, stream, version, value = leaf
    event = by_position.get(position)
    name = str(stream)
    if event is None:
        report.problems.append(Problem(name, version, f"deleted (leaf {index}, position"
                                       f" {position})"))
        return
    if (event.stream, event.version) != (stream, version):
        report.problems.append(Problem(name, version, f"position {position} (leaf {index}) now"
                                       f" holds version {event.version} of stream"
                                       f" {event.stream}: versions were swapped or rewritten"))
        return
    previous = chains.GENESIS if version == 1 else logged.get((stream, version - 1))
    if _link(event, previous or b"", redactions) != value:
        report.problems.append(Problem(name, version, f"changed since it was logged (leaf"
                                       f" {index}): its bytes do not hash to the logged chain"))


def _check_stored_chains(
    events: list[_Event], stored: dict[int, bytes | None], report: LedgerReport,
    redactions: Redactions,
) -> None:
    """Each event's chain hash as its save wrote it, against its bytes and its
    stream's previous stored hash (so only the event that changed is named)."""
    by_key = {(e.stream, e.version): stored.get(e.position) for e in events}
    for event in events:
        value = stored.get(event.position)
        previous = (chains.GENESIS if event.version == 1
                    else by_key.get((event.stream, event.version - 1)))
        if value is None or previous is None:
            continue  # written before chains, not yet backfilled
        if _link(event, previous, redactions) != value:
            report.problems.append(Problem(str(event.stream), event.version,
                                           "its stored chain hash does not match its bytes"))


def _trees(
    leaves: list[tuple[int, int, uuid.UUID, int, bytes]],
    computed: dict[tuple[uuid.UUID, int], bytes],
) -> _Trees:
    """The log rebuilt from the events as they are now (a leaf whose event
    is gone keeps its logged hash: its deletion is reported on its own), and
    from the leaves as logged."""
    events, logged = merkle.MemoryTree(), merkle.MemoryTree()
    for _, _, stream, version, value in leaves:
        events.append(computed.get((stream, version), value))
        logged.append(value)
    return _Trees(events, logged, leaves)


@dataclass(frozen=True)
class _Trees:
    """The log rebuilt from the events as they are now, and as its leaves
    logged them (they differ where an event changed since it was logged)."""

    events: merkle.MemoryTree
    logged: merkle.MemoryTree
    leaves: list[Leaf]

    def first_change(self, size: int) -> Leaf | None:
        """The first leaf below ``size`` whose event no longer hashes to it."""
        return next((leaf for leaf in self.leaves[:size]
                     if self.events.node(0, leaf[0]) != self.logged.node(0, leaf[0])), None)


def _cut(source: str, checkpoint: Checkpoint, trees: _Trees, unlogged: _Event | None) -> Problem:
    size, held = checkpoint.size, trees.events.size
    first = (f"the first event after the log's end is stream {unlogged.stream} version"
             f" {unlogged.version} (position {unlogged.position})" if unlogged
             else "their events are gone too")
    return Problem(None, None, f"{source} covers {size} events but the log holds {held}:"
                   f" the log was cut (leaf {held} on is gone; {first})")


def _changed(source: str, checkpoint: Checkpoint, trees: _Trees, start: int) -> Problem:
    """A checkpoint the rebuilt log does not match, with the first event at
    fault: the first changed since it was logged when the leaves still match
    the checkpoint, else the first after the last checkpoint that matches."""
    size = checkpoint.size
    changed = trees.first_change(size)
    if changed is not None and trees.logged.root(size) == checkpoint.root:
        index, position, stream, version, _ = changed
        return Problem(str(stream), version, f"{source} (size {size}): the first event it"
                       f" covers that changed since it was logged is this one (leaf {index},"
                       f" position {position})")
    window = trees.leaves[start:size]
    if not window:
        return Problem(None, None, f"{source} (size {size}): its root is not the log's")
    listed = ", ".join(f"{s} v{v}" for _, _, s, v, _ in window[:WINDOW_LISTED])
    _, position, stream, version, _ = window[0]
    return Problem(None, None, f"{source} (size {size}): the history it covers changed after"
                   f" the last checkpoint that still matches (size {start}); the first event"
                   f" it may concern is stream {stream} version {version} (leaf {start},"
                   f" position {position}); leaves {start} to {size - 1}: {listed}")


def _check_checkpoints(
    notes: list[tuple[str, str]], trees: _Trees, keyring: Keyring, report: LedgerReport,
    unlogged: _Event | None,
) -> int:
    """Each signed checkpoint (where it came from, note) against the rebuilt
    log; a failing one names the first event at fault, or bounds where. The
    largest size a checkpoint signed (0: none; one the log does not match is
    a problem of its own)."""
    matched: set[int] = {0}
    signed = 0
    for source, note in notes:
        try:
            checkpoint: Checkpoint = keyring.open_checkpoint(note)
        except NoteError as error:
            report.problems.append(Problem(None, None, f"{source}: {error}"))
            continue
        report.checkpoints += 1
        signed = max(signed, checkpoint.size)
        if checkpoint.size > trees.events.size:
            report.problems.append(_cut(source, checkpoint, trees, unlogged))
        elif trees.events.root(checkpoint.size) != checkpoint.root:
            start = max((size for size in matched if size < checkpoint.size), default=0)
            report.problems.append(_changed(source, checkpoint, trees, start))
        else:
            matched.add(checkpoint.size)
    return signed


def _check_order(leaves: list[Leaf], by_position: dict[int, _Event],
                 report: LedgerReport) -> None:
    """The store's order is the log's: leaf i is the event at the i-th
    smallest position the log holds (the sequencer appends in settled global
    order), so two events whose stored positions were swapped are named."""
    expected = sorted(position for _, position, _, _, _ in leaves)
    for (index, position, stream, version, _), place in zip(leaves, expected, strict=True):
        if position != place:
            held = by_position.get(position)
            what = (f"stream {held.stream} version {held.version}" if held else "no event")
            report.problems.append(Problem(str(stream), version, f"logged as leaf {index},"
                                           f" whose place in the store's order is position"
                                           f" {place}, but stored at position {position}"
                                           f" (holding {what}): the store's order is not the"
                                           " log's (positions swapped or rewritten)"))


def _check_reanchors(statements: list[str], keyring: Keyring, report: LedgerReport) -> None:
    """The re-anchor statements: each must be signed by a key of the keyring;
    the ones that are are summed up for the report (old and new size, when,
    why), a forged one is a problem."""
    verifiers = [entry.verifier for entry in keyring.entries]
    for note in statements:
        try:
            text, _ = open_note(note, verifiers)
        except NoteError as error:
            report.problems.append(Problem(None, None, f"a re-anchor statement in the store"
                                           f" does not verify ({error})"))
            continue
        lines = text.splitlines()
        report.reanchors.append(" ".join(line for line in lines[2:6]))


def _unreadable_ids(app: Tasks, database: Database, report: LedgerReport) -> bool:
    """Events stored under a stream id that is no UUID at all (SQLite text;
    the store's trigger refuses them, an attacker may drop it): the
    application cannot read the events past them, so neither can the rest of
    the audit. Each is named by its position; whether there were any."""
    table = app.recorder.events_table_name  # type: ignore[attr-defined]
    with database.transaction() as tx:
        spelled = store.stored_stream_ids(tx, database.backend, table)
    for position, raw in sorted(spelled.items()):
        try:
            uuid.UUID(str(raw))
        except ValueError:
            report.problems.append(Problem(None, None, f"the event at position {position} is"
                                           f" stored under {raw!r}, which is not a stream id:"
                                           " the application cannot read the events past it"))
    return bool(report.problems)


def verify_ledger(
    app: Tasks, database: Database, keyring: Keyring, outside: str | None = None
) -> LedgerReport:
    """Recompute the chains and the log from the events and check them against
    the leaves, the store's signed checkpoints and ``outside`` (a checkpoint
    the auditor kept out of the database's reach)."""
    report = LedgerReport()
    if _unreadable_ids(app, database, report):
        return report
    events, leaves = _events(app), _leaves(database, report)
    report.events, report.leaves = len(events), len(leaves)
    redactions = _redactions(events, leaves, report, keyring)
    computed = _chains(events, report, redactions)
    by_position = {e.position: e for e in events}
    logged = {(s, v): h for _, _, s, v, h in leaves}
    for leaf in leaves:
        _check_leaf(leaf, by_position, logged, report, redactions)
    _check_order(leaves, by_position, report)
    last_logged = leaves[-1][1] if leaves else 0
    in_log = {n for _, n, _, _, _ in leaves}
    for event in events:
        if event.position <= last_logged and event.position not in in_log:
            report.problems.append(Problem(str(event.stream), event.version,
                                           f"position {event.position} is not in the log"))
    table = app.recorder.events_table_name  # type: ignore[attr-defined]
    with database.transaction() as tx:
        notes = [(f"stored checkpoint {size}", note) for size, note in store.all_checkpoints(tx)]
        stored = store.stored_chain_hashes(tx, database.backend, table)
        spelled = store.stored_stream_ids(tx, database.backend, table)
        statements = store.reanchors(tx, database.backend)
    _check_reanchors(statements, keyring, report)
    _check_stream_ids(events, spelled, database.backend, report)
    _check_stored_chains(events, stored, report, redactions)
    if outside is not None:
        notes.append(("the given checkpoint", outside))
    notes.sort(key=lambda item: _size(item[1]))
    unlogged = next((e for e in events if e.position > last_logged), None)
    covered = _check_checkpoints(notes, _trees(leaves, computed), keyring, report, unlogged)
    report.problems.extend(Problem(None, None, line)
                           for line in signed_map_problems(notes, keyring, leaves))
    _check_redactions(events, leaves, redactions, computed, covered, report)
    _check_forgotten(app, events, report)
    return report


def _check_redactions(events: list[_Event], leaves: list[Leaf], redactions: Redactions,
                      computed: dict[tuple[uuid.UUID, int], bytes], covered: int,
                      report: LedgerReport) -> None:
    """Each event a statement names: its statement must be logged under a
    signed checkpoint the log matches (the statement is only as good as the
    log's anchoring), and its bytes must be the redacted ones, not still the
    cleartext it was logged with (a forget that stopped before its rewrite)."""
    index = {n: i for i, n, _, _, _ in leaves}
    by_key = {(e.stream, e.version): e for e in events}
    for (stream, version), entry in sorted(redactions.items()):
        event = by_key.get((stream, version))
        if event is None:
            continue  # its deletion is reported on its own
        leaf = index.get(entry.statement)
        if leaf is None or leaf >= covered:
            report.problems.append(Problem(str(stream), version, f"rewritten by the redaction"
                                           f" statement at position {entry.statement}, which no"
                                           " signed checkpoint covers yet: audit again after the"
                                           " next checkpoint"))
        previous = chains.GENESIS if version == 1 else computed.get((stream, version - 1), b"")
        if chains.chain_hash(stream, version, previous, event.topic,
                             event.state) == entry.original:
            report.problems.append(Problem(str(stream), version, "forgotten, but it still holds"
                                           " its free text in cleartext (the forget stopped"
                                           " before rewriting it): run the forget again"))


def _check_forgotten(app: Tasks, events: list[_Event], report: LedgerReport) -> None:
    """Each forgotten task: its key must be gone, and its sealed events are
    reported consistent when no check above named their streams."""
    tasks = [e.stream for e in events if e.topic == FORGOTTEN]
    reader = app.keys.reader
    kept = set(reader(tasks)) if tasks and reader is not None else set()
    for task in sorted(kept, key=str):
        report.problems.append(Problem(str(task), None, "forgotten, but its data key is still"
                                       " stored (task_keys): its free text is readable"))
    report.forgotten = forgotten_tasks(
        events, [(p.stream, p.version) for p in report.problems], kept
    )


def _size(note: str) -> int:
    try:
        return int(note.split("\n")[1])
    except (IndexError, ValueError):
        return -1


def describe(report: LedgerReport) -> list[str]:
    head = (f"ledger: {report.events} events, {report.leaves} in the log, "
            f"{report.checkpoints} signed checkpoints checked")
    lines = [head, *(f"  {p.line()}" for p in report.problems)]
    lines.extend(f"  {line}" for forgotten in report.forgotten for line in forgotten.lines())
    for statement in report.reanchors:
        lines.append(f"  note: an operator re-anchored the log after a restore: {statement};"
                     " a checkpoint of the history before it that fails above is of a"
                     " history that no longer exists (docs/operations.md, Restoring the"
                     " ledger)")
    lines.append("OK" if report.ok else f"FAILED: {len(report.problems)} problem(s)")
    return lines


__all__ = ["LedgerReport", "Problem", "describe", "verify_ledger"]
