"""The tasks read model behind list queries: one row per live task holding
its current DTO, ordered by the position of its creation."""

from __future__ import annotations

import json
from typing import Any

from kandev_es.projections.base import db_id

from kandev_es.domain.task import Task
from kandev_es.storage.database import Transaction
from kandev_es.views import task_dto


class TasksProjection:
    name = "tasks"

    def apply(self, tx: Transaction, event: Any, position: int, backend: str) -> None:
        if isinstance(event, Task.Created):
            task = event.mutate(None)
            assert isinstance(task, Task)
            self._insert(tx, task_dto(task), position, backend)
            return
        if not isinstance(event, Task.Event):
            return
        task_id = db_id(event.originator_id, backend)
        rows = tx.execute("SELECT dto FROM tasks_view WHERE task_id = ?", (task_id,))
        if not rows:
            return
        if isinstance(event, Task.Deleted):
            tx.execute("DELETE FROM tasks_view WHERE task_id = ?", (task_id,))
            return
        dto = json.loads(rows[0][0])
        _patch(dto, event)
        dto["updated_at"] = event.timestamp.isoformat()
        tx.execute(
            "UPDATE tasks_view SET dto = ?, external_id = ?, phase = ?, archived = ?,"
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

    @staticmethod
    def _insert(tx: Transaction, dto: dict[str, Any], position: int, backend: str) -> None:
        tx.execute(
            "INSERT INTO tasks_view (task_id, workspace_id, identifier, external_id, phase,"
            " archived, revision, position, dto) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (task_id) DO NOTHING",
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


def _patch(dto: dict[str, Any], event: Any) -> None:
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
