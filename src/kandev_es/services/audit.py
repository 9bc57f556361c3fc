"""``kandev-es audit verify``: replay every Task stream from the event store
and compare the result with the tasks read model, row by row.

The read model and its tracking position are read together (the tracking row
is share-locked on PostgreSQL, so no runner commit slips in between), and the
replay stops at that same position — so a live, lagging projection is never
reported as a disagreement; only a row that is actually wrong is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kandev_es.application import Tasks
from kandev_es.domain.task import TASK_ABORTED, Task
from kandev_es.projections.base import event_topics
from kandev_es.storage.database import Database
from kandev_es.views import task_dto

BATCH = 5000
COLUMNS = ("identifier", "external_id", "state", "archived", "revision")


@dataclass(frozen=True)
class Disagreement:
    task_id: str
    problem: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class AuditReport:
    position: int
    streams: int = 0
    rows: int = 0
    disagreements: list[Disagreement] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.disagreements

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "position": self.position,
            "task_streams": self.streams,
            "tasks_view_rows": self.rows,
            "disagreements": [d.__dict__ for d in self.disagreements],
        }


def _read_model(database: Database) -> tuple[int, dict[str, tuple[Any, ...]]]:
    lock = " FOR SHARE" if database.backend == "postgres" else ""
    with database.transaction() as tx:
        rows = tx.execute(
            "SELECT position FROM projection_tracking WHERE name = 'tasks'" + lock
        )
        position = int(rows[0][0]) if rows else 0
        view = tx.execute(
            "SELECT task_id, position, identifier, external_id, phase, archived, revision, dto"
            " FROM tasks_view"
        )
    return position, {str(row[0]): tuple(row[1:]) for row in view}


def _written_later(view: dict[str, tuple[Any, ...]], position: int) -> set[str]:
    """Rows written inline, in their save, by events past the tracked position
    (a save under way while the audit reads): their streams are audited by
    the next run, not reported against a replay that stops before them."""
    later = {key for key, row in view.items() if int(row[0]) > position}
    for key in later:
        del view[key]
    return later


def _replay(app: Tasks, stop: int) -> dict[str, Task]:
    tasks: dict[str, Task] = {}
    topics = list(event_topics(Task))
    start = 0
    while start < stop:
        batch = app.recorder.select_notifications(
            start=start, limit=BATCH, stop=stop, topics=topics, inclusive_of_start=False
        )
        if not batch:
            break
        with app.keys.reading(n.state for n in batch):
            for notification in batch:
                event: Any = app.mapper.to_domain_event(notification)
                key = str(event.originator_id)
                mutated = event.mutate(tasks.get(key))
                assert isinstance(mutated, Task)
                tasks[key] = mutated
        start = batch[-1].id
    return tasks


def _compare(task_id: str, expected: dict[str, Any], row: tuple[Any, ...]) -> list[Disagreement]:
    _, identifier, external_id, phase, archived, revision, raw = row
    found: list[Disagreement] = []
    try:
        dto = json.loads(raw)
    except ValueError:
        return [Disagreement(task_id, "unreadable dto", {"dto": str(raw)[:200]})]
    for key in sorted(set(expected) | set(dto)):
        if expected.get(key) != dto.get(key):
            found.append(
                Disagreement(
                    task_id,
                    f"dto field {key} differs",
                    {"event_store": expected.get(key), "read_model": dto.get(key)},
                )
            )
    columns = (identifier, external_id, phase, bool(archived), revision)
    wanted = tuple(expected.get(c) for c in COLUMNS)
    for name, have, want in zip(COLUMNS, columns, wanted, strict=True):
        if have != want:
            found.append(
                Disagreement(
                    task_id,
                    f"column {name} differs",
                    {"event_store": want, "read_model": have},
                )
            )
    return found


def verify_tasks(app: Tasks, database: Database) -> AuditReport:
    position, view = _read_model(database)
    later = _written_later(view, position)
    replayed = _replay(app, position)
    report = AuditReport(position=position, streams=len(replayed), rows=len(view))
    expected = {
        key: task_dto(task)
        for key, task in replayed.items()
        if not task.deleted and task.phase != TASK_ABORTED and key not in later
    }
    for key in sorted(set(expected) | set(view)):
        if key not in view:
            report.disagreements.append(Disagreement(key, "missing from tasks_view"))
        elif key not in expected:
            report.disagreements.append(
                Disagreement(key, "in tasks_view but not a live task in the event store")
            )
        else:
            report.disagreements.extend(_compare(key, expected[key], view[key]))
    return report
