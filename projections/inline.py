"""Inline projections (docs/architecture.md: Inline projections): the rows a
save changes in the task, identity and creation read models and the feeds,
made from the events and aggregates the request holds in memory -- nothing
read back, nothing decoded -- and written by the recorder in the save's own
transaction (storage/view_writes.py), so a caller reads its write as soon as
the save answers, on any node.

The rows are those the projection loop's projections (tasks.py, identities.py,
creations.py, feeds.py) make of the same events, which is what a rebuild
replays: a task's row is its DTO after the save (``task_dto``, which
``advance`` follows: tests/unit/test_task_read_model.py), an identity's row
its latest tenure, a creation's row its tenure while in flight, and the feed
rows those ``feed_kind`` names, each with the DTO at its event. A task the
save creates is followed through ``advance`` from its Created event; any
other task's save holds one event of it (every command is one event), whose
DTO is the task's after the save."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from kandev_es.projections.feeds import feed_kind, feed_row
from kandev_es.projections.tasks import advance

from kandev_es.domain.identity import ABORTED, COMPLETED, Identity
from kandev_es.domain.task import TASK_ABORTED, TASK_ACTIVE, Task
from kandev_es.storage.view_writes import ViewRows, ViewsFailed
from kandev_es.views import task_dto

_ENDED = (COMPLETED, ABORTED)


class InlineViews:
    """``Tasks.inline``: the view rows of one save."""

    def __call__(
        self,
        events: Sequence[Any],
        aggregates: Sequence[Any],
        dtos: Mapping[uuid.UUID, dict[str, Any]] | None = None,
    ) -> ViewRows:
        """``dtos``: tasks' DTOs after the save, where the saver made them."""
        views: dict[str, list[tuple[Any, ...]]] = {}
        indexed: dict[uuid.UUID, list[tuple[int, Any]]] = {}
        for index, event in enumerate(events):
            indexed.setdefault(event.originator_id, []).append((index, event))
        for aggregate in aggregates:
            own = indexed.get(aggregate.id)
            if not own:
                continue
            if isinstance(aggregate, Task):
                made = dtos.get(aggregate.id) if dtos else None
                _task_rows(views, aggregate, own, made)
            elif isinstance(aggregate, Identity):
                _identity_rows(views, aggregate, own)
        return views


def _add(views: dict[str, list[tuple[Any, ...]]], key: str, row: tuple[Any, ...]) -> None:
    views.setdefault(key, []).append(row)


def _task_rows(
    views: dict[str, list[tuple[Any, ...]]],
    task: Task,
    events: list[tuple[int, Any]],
    made: dict[str, Any] | None = None,
) -> None:
    gone = task.deleted or task.phase == TASK_ABORTED
    final = None if gone else made if made is not None else task_dto(task)
    key = str(task.id) if final is None else final["id"]
    born = events[0][0] if isinstance(events[0][1], Task.Created) else None
    if final is None:
        if born is None:
            _add(views, "tasks_gone", (key,))
            _add(views, "feed_tasks_gone", (key,))
    else:
        text = json.dumps(final)
        columns = (final.get("external_id"), final["state"], final["archived"], final["revision"])
        if born is not None:
            _add(views, "tasks_born", (born, key, final["workspace_id"], final["identifier"],
                                       *columns, text))  # fmt: skip
        else:
            _add(views, "tasks_changed", (key, *columns, text))
        _add(views, "feed_tasks", (key, text))
        if len(events) == 1:  # one event: the DTO at it is the final one (made once)
            index, event = events[0]
            # Active before it unless it is the activation itself or the task's birth.
            was_active = final["state"] == TASK_ACTIVE and not isinstance(
                event, Task.Activated | Task.Created
            )
            kind = feed_kind(event, was_active)
            if kind is not None:
                _add(views, "feed", (index, *feed_row(event, kind, final, text)))
            return
    _feed_rows(views, task, events, final, born is not None)


def _feed_rows(
    views: dict[str, list[tuple[Any, ...]]],
    task: Task,
    events: list[tuple[int, Any]],
    final: dict[str, Any] | None,
    born: bool,
) -> None:
    if born:  # followed from its Created, as the feeds projection does
        states: dict[uuid.UUID, dict[str, Any] | None] = {}
        for index, event in events:
            before = states.get(task.id)
            was_active = before is not None and before["state"] == TASK_ACTIVE
            dto = advance(states, event)
            kind = None if dto is None else feed_kind(event, was_active)
            if kind is not None and dto is not None:
                _add(views, "feed", (index, *feed_row(event, kind, dto)))
        return
    if len(events) != 1:
        raise ViewsFailed(f"a save of {len(events)} events of task {task.id} it did not create")
    # One event that ends the task (Deleted, CreationAborted): no feed row.


def _identity_rows(
    views: dict[str, list[tuple[Any, ...]]], identity: Identity, events: list[tuple[int, Any]]
) -> None:
    key = str(identity.id)
    if identity.external_id is not None:  # anonymous identities are not indexed
        latest = identity.tenures[max(identity.tenures)] if identity.tenures else None
        _add(views, "identities", (
            key, str(identity.workspace_id), identity.external_id,
            None if latest is None else str(latest.task_id),
            0 if latest is None else latest.number,
            "free" if latest is None else latest.phase,
            latest is not None and latest.holds,
        ))  # fmt: skip
    claimed = {e.tenure for _, e in events if isinstance(e, Identity.Claimed)}
    touched = {e.tenure for _, e in events if hasattr(e, "tenure")}
    for number in sorted(touched):
        tenure = identity.tenures[number]
        if tenure.phase in _ENDED:
            if number not in claimed:  # a row claimed and ended in one save never existed
                _add(views, "creations_gone", (key, number))
            continue
        workspace = tenure.plan.get("workspace_id")
        _add(views, "creations", (
            key, number, None if workspace is None else str(workspace), str(tenure.task_id),
            tenure.phase, tenure.epoch, tenure.lease_expires_at.timestamp(),
        ))  # fmt: skip
