"""The batch's envelope: ``workspace_id``, ``tasks`` (each item a single
create's body) and ``atomic``. Checked whole before any item is read: an
unusable envelope is refused and nothing is written. The items themselves are
left to the create protocol, item by item (a held identity is found before its
body is validated, AC-4)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from marshmallow import Schema, fields

from kandev_es.creation.request import CreateTaskRequestSchema
from kandev_es.errors import BatchTooLarge, InvalidBatch

FIELDS = frozenset({"workspace_id", "tasks", "atomic"})


class BatchCreateRequestSchema(Schema):
    """The batch body, as published (the OpenAPI); ``load_batch`` checks it."""

    workspace_id = fields.UUID(
        load_default=None,
        metadata={"description": "target workspace of every item (default: the token's)"},
    )
    tasks = fields.List(
        fields.Nested(CreateTaskRequestSchema),
        required=True,
        metadata={
            "description": (
                "the items, each a single create's body (up to KANDEV_BATCH_MAX_ITEMS); "
                "an item's own workspace_id, if any, must be the batch's"
            )
        },
    )
    atomic = fields.Boolean(
        load_default=False,
        metadata={
            "description": (
                "true: nothing is created unless every item would be created or found "
                "(422 batch_refused lists every failing index); items with effects are refused"
            )
        },
    )


@dataclass(frozen=True)
class Batch:
    workspace: object  # as sent: the protocol's step 1 reads it
    items: list[dict[str, Any]]
    atomic: bool


def load_batch(body: Mapping[str, Any], max_items: int) -> Batch:
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise InvalidBatch("the batch takes workspace_id, tasks and atomic only", fields=unknown)
    tasks = body.get("tasks")
    if not isinstance(tasks, list):
        raise InvalidBatch("tasks must be a list of create bodies", field="tasks")
    if len(tasks) > max_items:
        raise BatchTooLarge(
            f"a batch holds at most {max_items} items (KANDEV_BATCH_MAX_ITEMS)",
            max_items=max_items,
            items=len(tasks),
        )
    not_objects = [index for index, item in enumerate(tasks) if not isinstance(item, dict)]
    if not_objects:
        raise InvalidBatch(
            "every item of tasks must be a JSON object (a create body)",
            field="tasks",
            indexes=not_objects[:100],
        )
    atomic = body.get("atomic", False)
    if not isinstance(atomic, bool):
        raise InvalidBatch("atomic must be true or false", field="atomic")
    return Batch(body.get("workspace_id"), tasks, atomic)
