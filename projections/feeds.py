"""The task.created / task.updated feeds (docs/api.md: Entry points), one table for every
workspace, read per workspace by position.

- ``task.created`` goes out on ``Task.Activated``, or on ``Task.CreatedActive``
  (a creation without effects, completed in the save that created the task):
  a task is activated only when its creation Completed, so there is exactly
  one per completed creation, none for a Found (a Found writes no event at
  all) and none before Completed. Its data is the DTO at that point;
  external_id only when still held (AC-7).
- ``task.updated`` goes out for ``Updated``, ``Archived``,
  ``ExternalIdCleared`` (release) and ``Forgotten`` of an active task. A
  release recorded while the creation is still preparing publishes nothing (AC-7).

Each feed row's position is the originating event's notification id and its id
is derived from (originator_id, originator_version), so a rebuild reproduces the
same ids in the same order. ``feed_tasks`` holds the projection's own copy of
each task's DTO, so the feed never depends on another read model's progress.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from kandev_es.projections.base import db_id, event_topics, load_dtos
from kandev_es.projections.tasks import advance

from kandev_es.domain.ids import namespace
from kandev_es.domain.task import FORGETTABLE_FIELDS, TASK_ACTIVE, Task
from kandev_es.storage.database import Transaction
from kandev_es.storage.tables import TableSet

FEED_NAMESPACE = uuid.UUID("3a1d6f0c-9b7e-4c52-8e14-7f2b5d9c0a61")
_feed_name_id = namespace(FEED_NAMESPACE)
TASK_CREATED = "task.created"
TASK_UPDATED = "task.updated"
UPDATES = (Task.Updated, Task.Archived, Task.ExternalIdCleared, Task.Forgotten)


def feed_event_id(originator_id: uuid.UUID | str, originator_version: int) -> uuid.UUID:
    """``originator_id`` as a UUID or its text (the same id either way)."""
    return _feed_name_id(f"{originator_id}:{originator_version}")


def feed_source(workspace_id: object) -> str:
    return f"kandev-es/workspaces/{workspace_id}"


def feed_kind(event: Any, was_active: bool) -> str | None:
    """The feed entry a Task event makes (None: none), ``was_active``: the
    task was active just before it (module docstring)."""
    if isinstance(event, Task.Activated | Task.CreatedActive):
        return TASK_CREATED
    if was_active and isinstance(event, UPDATES):
        return TASK_UPDATED
    return None


def feed_row(
    event: Any, kind: str, dto: dict[str, Any], text: str | None = None
) -> tuple[Any, ...]:
    """A feed row after its position: (workspace, id, type, subject, timestamp,
    data); ``text``: the DTO as JSON already, if made."""
    subject = dto["id"]  # the task's id as text: the event's originator
    return (
        dto["workspace_id"],
        str(feed_event_id(subject, event.originator_version)),
        kind,
        subject,
        event.timestamp.isoformat(),
        json.dumps(dto) if text is None else text,
    )


class FeedsProjection(TableSet):
    name = "feeds"
    inline = True  # written in each save (projections/inline.py); replayed by rebuilds
    tables = ("feed_events", "feed_tasks")
    topics = event_topics(Task)

    def apply(self, tx: Transaction, event: Any, position: int, backend: str) -> None:
        self.apply_batch(tx, [(event, position)], backend)

    def apply_batch(self, tx: Transaction, items: Sequence[tuple[Any, int]], backend: str) -> None:
        events = [(e, p) for e, p in items if isinstance(e, Task.Event)]
        if not events:
            return
        wanted = {e.originator_id for e, _ in events if not isinstance(e, Task.Created)}
        states: dict[uuid.UUID, dict[str, Any] | None] = self._load(tx, wanted, backend)
        changed: set[uuid.UUID] = set()
        rows: list[tuple[Any, ...]] = []
        for event, position in events:
            task_id = event.originator_id
            changed.add(task_id)
            before = states.get(task_id)
            was_active = before is not None and before["state"] == TASK_ACTIVE
            dto = advance(states, event)
            if dto is None:
                continue
            kind = feed_kind(event, was_active)
            if kind is not None:
                rows.append(self._row(event, position, kind, dto, backend))
        self._write(tx, rows, {k: states.get(k) for k in changed}, backend)
        forgotten = {  # each forgotten task's workspace (its rows' index)
            e.originator_id: dto["workspace_id"]
            for e, _ in events
            if isinstance(e, Task.Forgotten) and (dto := states.get(e.originator_id))
        }
        if forgotten:
            self._erase(tx, forgotten, backend)

    def _erase(self, tx: Transaction, tasks: dict[uuid.UUID, str], backend: str) -> None:
        """A forgotten task's earlier rows with their free text null, as the
        forget rewrote the live ones (erasure/service.py): a rebuild that
        decoded the task's events before the forget, with its key, would
        otherwise swap rows holding the text back in."""
        table = self.t("feed_events")
        for task_id, workspace in tasks.items():
            found = tx.execute(
                f"SELECT position, data FROM {table} WHERE workspace_id = ? AND subject = ?",
                (db_id(uuid.UUID(str(workspace)), backend), db_id(task_id, backend)),
            )
            changed = []
            for position, data in found:
                dto = json.loads(data)
                if any(dto.get(name) is not None for name in FORGETTABLE_FIELDS):
                    dto.update(dict.fromkeys(FORGETTABLE_FIELDS))
                    changed.append((json.dumps(dto), position))
            if changed:
                tx.executemany(f"UPDATE {table} SET data = ? WHERE position = ?", changed)

    @staticmethod
    def _row(
        event: Any, position: int, kind: str, dto: dict[str, Any], backend: str
    ) -> tuple[Any, ...]:
        workspace, event_id, kind, subject, timestamp, data = feed_row(event, kind, dto)
        return (
            position,
            db_id(uuid.UUID(workspace), backend),
            db_id(uuid.UUID(event_id), backend),
            kind,
            db_id(uuid.UUID(subject), backend),
            timestamp,
            data,
        )

    def _load(
        self, tx: Transaction, task_ids: Iterable[uuid.UUID], backend: str
    ) -> dict[uuid.UUID, dict[str, Any] | None]:
        return dict(load_dtos(tx, self.t("feed_tasks"), task_ids, backend))

    def _write(
        self,
        tx: Transaction,
        rows: list[tuple[Any, ...]],
        states: dict[uuid.UUID, dict[str, Any] | None],
        backend: str,
    ) -> None:
        if rows:
            tx.executemany(
                f"INSERT INTO {self.t('feed_events')} (position, workspace_id, event_id, type,"
                " subject, timestamp, data) VALUES (?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
        gone = [(db_id(k, backend),) for k, v in states.items() if v is None]
        kept = [(db_id(k, backend), json.dumps(v)) for k, v in states.items() if v is not None]
        if gone:
            tx.executemany(f"DELETE FROM {self.t('feed_tasks')} WHERE task_id = ?", gone)
        if kept:
            tx.executemany(
                f"INSERT INTO {self.t('feed_tasks')} (task_id, dto) VALUES (?, ?)"
                " ON CONFLICT (task_id) DO UPDATE SET dto = excluded.dto",
                kept,
            )
