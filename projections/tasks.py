"""The tasks read model behind list queries: one row per live task holding
its current DTO, ordered by the position of its creation."""

from __future__ import annotations

import json
from typing import Any

from kandev_es.projections.base import db_id, event_topics

from kandev_es.domain.task import Task
from kandev_es.storage.database import Transaction
from kandev_es.storage.tables import TableSet
from kandev_es.views import task_dto


class TasksProjection(TableSet):
    name = "tasks"
    tables = ("tasks_view",)
    topics = event_topics(Task)

    def apply(self, tx: Transaction, event: Any, position: int, backend: str) -> None:
        table = self.t("tasks_view")
        if isinstance(event, Task.Created):
            self._insert(tx, initial_dto(event), position, backend)
            return
        if not isinstance(event, Task.Event):
            return
        task_id = db_id(event.originator_id, backend)
        rows = tx.execute(f"SELECT dto FROM {table} WHERE task_id = ?", (task_id,))
        if not rows:
            return
        if isinstance(event, Task.Deleted | Task.CreationAborted):
            # An aborted creation never existed for callers; a deleted task is gone.
            tx.execute(f"DELETE FROM {table} WHERE task_id = ?", (task_id,))
            return
        dto = json.loads(rows[0][0])
        patch_dto(dto, event)
        tx.execute(
            f"UPDATE {table} SET dto = ?, external_id = ?, phase = ?, archived = ?,"
            " revision = ? WHERE task_id = ?",
            (
                json.dumps(dto),
                dto.get("external_id"),
                dto["state"],
                dto["archived"],
                dto["revision"],
                task_id,
            ),
        )

    def _insert(self, tx: Transaction, dto: dict[str, Any], position: int, backend: str) -> None:
        tx.execute(
            f"INSERT INTO {self.t('tasks_view')} (task_id, workspace_id, identifier,"
            " external_id, phase, archived, revision, position, dto)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (task_id) DO NOTHING",
            (
                db_id(dto["id"], backend),
                db_id(dto["workspace_id"], backend),
                dto["identifier"],
                dto.get("external_id"),
                dto["state"],
                dto["archived"],
                dto["revision"],
                position,
                json.dumps(dto),
            ),
        )


def initial_dto(event: Task.Created) -> dict[str, Any]:
    task = event.mutate(None)
    assert isinstance(task, Task)
    return task_dto(task)


def patch_dto(dto: dict[str, Any], event: Any) -> None:
    """Advance a task DTO by one Task event, exactly as ``task_dto`` would see it."""
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
    elif isinstance(event, Task.CreationAborted):
        dto["state"] = "aborted"
    elif isinstance(event, Task.Deleted):
        dto["revision"] += 1
    dto["updated_at"] = event.timestamp.isoformat()
