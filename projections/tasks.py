"""The tasks read model behind list queries: one row per live task holding
its current DTO, ordered by the position of its creation.

Events are applied a batch at a time: the batch's existing rows are read in
one query, advanced in memory, and written back with one statement per kind
of change — that is what lets a rebuild replay tens of thousands of events a
second."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from kandev_es.projections.base import db_id, event_topics, load_dtos

from kandev_es.domain.task import FORGETTABLE_FIELDS, Task
from kandev_es.storage.database import Transaction
from kandev_es.storage.tables import TableSet
from kandev_es.views import task_dto


class TasksProjection(TableSet):
    name = "tasks"
    inline = True  # written in each save (projections/inline.py); replayed by rebuilds
    tables = ("tasks_view",)
    topics = event_topics(Task)

    def apply(self, tx: Transaction, event: Any, position: int, backend: str) -> None:
        self.apply_batch(tx, [(event, position)], backend)

    def apply_batch(self, tx: Transaction, items: Sequence[tuple[Any, int]], backend: str) -> None:
        events = [(e, p) for e, p in items if isinstance(e, Task.Event)]
        wanted = [e.originator_id for e, _ in events if not isinstance(e, Task.Created)]
        existing = self._load(tx, set(wanted), backend)
        dtos: dict[uuid.UUID, dict[str, Any] | None] = dict(existing)
        born: dict[uuid.UUID, int] = {}
        for event, position in events:
            if isinstance(event, Task.Created):
                born[event.originator_id] = position
            advance(dtos, event)
        self._write(tx, dtos, born, set(existing), backend)

    def _load(
        self, tx: Transaction, task_ids: set[uuid.UUID], backend: str
    ) -> dict[uuid.UUID, dict[str, Any]]:
        return dict(load_dtos(tx, self.t("tasks_view"), task_ids, backend))

    def _write(
        self,
        tx: Transaction,
        dtos: dict[uuid.UUID, dict[str, Any] | None],
        born: dict[uuid.UUID, int],
        existing: set[uuid.UUID],
        backend: str,
    ) -> None:
        table = self.t("tasks_view")
        inserts, updates, deletes = [], [], []
        for task_id, dto in dtos.items():
            key = db_id(task_id, backend)
            if dto is None:
                if task_id in existing:
                    deletes.append((key,))
                continue
            columns = (dto.get("external_id"), dto["state"], dto["archived"], dto["revision"])
            if task_id in born:
                inserts.append(
                    (
                        key,
                        db_id(dto["workspace_id"], backend),
                        dto["identifier"],
                        *columns,
                        born[task_id],
                        json.dumps(dto),
                    )
                )
            elif task_id in existing:
                updates.append((json.dumps(dto), *columns, key))
        if inserts:
            tx.executemany(
                f"INSERT INTO {table} (task_id, workspace_id, identifier, external_id, phase,"
                " archived, revision, position, dto) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (task_id) DO NOTHING",
                inserts,
            )
        if updates:
            tx.executemany(
                f"UPDATE {table} SET dto = ?, external_id = ?, phase = ?, archived = ?,"
                " revision = ? WHERE task_id = ?",
                updates,
            )
        if deletes:
            tx.executemany(f"DELETE FROM {table} WHERE task_id = ?", deletes)


def initial_dto(event: Task.Created) -> dict[str, Any]:
    task = event.mutate(None)
    assert isinstance(task, Task)
    return task_dto(task)


def advance(states: dict[uuid.UUID, dict[str, Any] | None], event: Any) -> dict[str, Any] | None:
    """Advance ``states`` (task id -> its DTO; None once gone) by one Task event,
    by the rule every task read model follows: Created starts the DTO, Deleted
    and CreationAborted end it (an aborted creation never existed for callers;
    a deleted task is gone), any other event patches it, and an event of a task
    not there changes nothing. The DTO it started or patched, or None."""
    task_id = event.originator_id
    if isinstance(event, Task.Created):
        started = states[task_id] = initial_dto(event)
        return started
    dto = states.get(task_id)
    if dto is None:
        return None
    if isinstance(event, Task.Deleted | Task.CreationAborted):
        states[task_id] = None
        return None
    patch_dto(dto, event)
    return dto


def patch_dto(dto: dict[str, Any], event: Any) -> None:
    """Advance a live task's DTO by one event other than Created, Deleted and
    CreationAborted (``advance`` ends the DTO on those), to what ``task_dto``
    makes of the task after it: tests/unit/test_task_read_model.py compares
    the two after every event of generated histories."""
    if isinstance(event, Task.Activated):
        dto["state"] = "active"
        if event.external_id_dropped:
            dto.pop("external_id", None)
    elif isinstance(event, Task.Updated):
        dto.update(event.changes)
        dto["revision"] += 1
    elif isinstance(event, Task.Archived):
        dto["archived"] = True
        dto["revision"] += 1
    elif isinstance(event, Task.ExternalIdCleared):
        dto.pop("external_id", None)
        dto["revision"] += 1
    elif isinstance(event, Task.Forgotten):
        dto.update(dict.fromkeys(FORGETTABLE_FIELDS), forgotten=True)
        dto["revision"] += 1
    dto["updated_at"] = event.timestamp.isoformat()
