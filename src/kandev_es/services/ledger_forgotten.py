"""What ``audit verify --ledger`` says of forgotten tasks (docs/auditing.md:
Erasure): each task with a ``Task.Forgotten`` event, the events sealed under
its deleted key (its own, its identity's, a release's stored answer), and
whether they are consistent -- every check of the audit passed for them --
and whether the key is really gone. The checks themselves are the audit's:
a forgotten event's ciphertext, topic and order are hashed like any other.
A task written before the upgrade also names the cleartext events its
forget rewrote (its ``Forgotten`` event's redaction statement: "redacted by
statement P", P the statement's position; erasure/redaction.py)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from eventsourcing.utils import get_topic
from kandev_es_client import ledger as chains
from kandev_es_client.merkle import ProofError

from kandev_es.domain.task import Task
from kandev_es.storage.sealing import SEALED, sealed_task

FORGOTTEN = get_topic(Task.Forgotten)


class _Stored(Protocol):
    @property
    def position(self) -> int: ...
    @property
    def stream(self) -> uuid.UUID: ...
    @property
    def version(self) -> int: ...
    @property
    def topic(self) -> str: ...
    @property
    def state(self) -> bytes: ...


@dataclass(frozen=True)
class ForgottenTask:
    task_id: str
    operation_id: str
    actor: str
    events: tuple[tuple[str, int], ...]  # (stream, version) sealed under its key
    key_kept: bool
    consistent: bool
    # (stream, version) of each cleartext event rewritten, and the position of
    # the statement that records it (0: none).
    redacted: tuple[tuple[str, int], ...] = ()
    statement: int = 0

    def lines(self) -> list[str]:
        state = "consistent" if self.consistent else "INCONSISTENT (problems above)"
        kept = "; ITS KEY IS STILL STORED (task_keys)" if self.key_kept else ""
        old = (
            f", {len(self.redacted)} events from before the upgrade redacted by statement"
            f" {self.statement}"
            if self.redacted
            else ""
        )
        head = (
            f"task {self.task_id}: forgotten, {state} ({len(self.events)} sealed events{old};"
            f" operation {self.operation_id} by {self.actor}){kept}"
        )
        return [head] + [
            f"  stream {stream} version {version}: redacted by statement {self.statement},"
            f" {state.split(' ')[0].lower()}"
            for stream, version in self.redacted
        ]


def _redacted(note: object) -> tuple[tuple[str, int], ...]:
    """The (stream, version) a Forgotten event's redaction statement names
    (its signature is the audit's check: services/ledger_audit.py)."""
    if not isinstance(note, str):
        return ()
    try:
        return tuple((str(e.stream), e.version) for e in chains.statement_entries(note, 0))
    except ProofError:
        return ()


def forgotten_tasks(
    events: Sequence[_Stored],
    problems: Iterable[tuple[str | None, int | None]],
    keys_kept: set[uuid.UUID],
) -> list[ForgottenTask]:
    """``problems``: the (stream, version) of each problem found (a task is
    consistent when none names its streams, nor the log as a whole);
    ``keys_kept``: the forgotten tasks whose key is still stored."""
    records: dict[uuid.UUID, dict[str, Any]] = {}
    for event in events:
        if event.topic == FORGOTTEN and event.stream not in records:
            records[event.stream] = {**json.loads(event.state), "_position": event.position}
    if not records:
        return []
    sealed: dict[uuid.UUID, list[tuple[str, int]]] = {task: [] for task in records}
    for event in events:
        if f'"{SEALED}"'.encode() in event.state:
            task = sealed_task(json.loads(event.state))
            if task in sealed:
                sealed[task].append((str(event.stream), event.version))
    named = [stream for stream, _ in problems]
    anywhere = None in named  # a problem of the log as a whole (a checkpoint's root)
    failed = {stream for stream in named if stream is not None}
    found = []
    for task, record in records.items():
        own = tuple(sealed[task])
        redacted = _redacted(record.get("redactions"))
        mine = {str(task), *(stream for stream, _ in own), *(stream for stream, _ in redacted)}
        consistent = not anywhere and not mine & failed
        found.append(
            ForgottenTask(
                str(task),
                str(record.get("operation_id")),
                str(record.get("actor")),
                own,
                task in keys_kept,
                consistent,
                redacted,
                int(record["_position"]) if redacted else 0,
            )
        )
    return found
