"""The task and workspace representations every entry point returns, each
defined once.

``TaskSchema`` is the contract: REST responses are dumped through it (and
through the schemas that extend it), and OpenAPI is generated from it.
``task_dto`` is derived from its fields, so REST, MCP, the CLI, the read
models and the feeds cannot drift from it. A field is read from the Task
attribute of the same name unless its metadata names another
(``task_attribute``), a ``date-time`` string is the attribute's ISO 8601
form; ``external_id`` (not required, not nullable) is omitted,
not null, on a task that holds none.

``WorkspaceSchema`` is the workspace's: ``workspace_dto`` is that schema's dump
of the aggregate, so REST (and its OpenAPI) shows every field the service
holds, its WIP limit and the names of its registered repositories included."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from marshmallow import Schema, fields, validate

from kandev_es.domain.task import Task
from kandev_es.domain.workspace import Workspace

TASK_STATES = ["preparing", "active"]


class TaskSchema(Schema):
    id = fields.UUID(required=True)
    workspace_id = fields.UUID(required=True)
    identifier = fields.String(required=True, metadata={"example": "KAN-42"})
    external_id = fields.String(
        metadata={
            "description": "present only while the task holds an external ID",
            "example": "JIRA-1",
        }
    )
    title = fields.String(
        required=True,
        allow_none=True,
        metadata={"example": "First task", "description": "null once the task is forgotten"},
    )
    description = fields.String(
        required=True,
        allow_none=True,
        metadata={"example": "", "description": "null once the task is forgotten"},
    )
    workflow = fields.String(required=True, metadata={"example": "default"})
    workflow_step = fields.String(required=True, metadata={"example": "backlog"})
    parent_id = fields.UUID(allow_none=True, required=True)
    repositories = fields.List(fields.String(), required=True)
    attachments = fields.List(fields.String(), required=True)
    start_agent = fields.Boolean(required=True)
    agent_profile = fields.String(allow_none=True, required=True)
    state = fields.String(
        required=True,
        validate=validate.OneOf(TASK_STATES),
        metadata={"task_attribute": "phase"},
    )
    archived = fields.Boolean(required=True)
    revision = fields.Integer(required=True)
    created_at = fields.String(
        required=True, metadata={"task_attribute": "created_on", "format": "date-time"}
    )
    updated_at = fields.String(
        required=True, metadata={"task_attribute": "modified_on", "format": "date-time"}
    )
    forgotten = fields.Boolean(
        metadata={
            "description": "present (true) only once the task's free text was forgotten"
            " (POST /api/v1/tasks/{id}/forget): title and description are then null"
        }
    )


Reader = Callable[[Task], Any]


def _reader(name: str, field: fields.Field[Any]) -> Reader:
    """How one TaskSchema field is read from a Task, as JSON-ready values."""
    get: Reader = operator.attrgetter(field.metadata.get("task_attribute", name))
    if isinstance(field, fields.UUID):
        return lambda task: None if (value := get(task)) is None else str(value)
    if isinstance(field, fields.List):
        return lambda task: list(get(task))
    if isinstance(field, fields.String) and field.metadata.get("format") == "date-time":
        return lambda task: get(task).isoformat()
    if isinstance(field, fields.String | fields.Boolean | fields.Integer):
        return get
    raise TypeError(f"TaskSchema.{name}: no reader for {type(field).__name__}")


# (key, reader, omitted when None): built once, in the schema's field order.
_READERS: tuple[tuple[str, Reader, bool], ...] = tuple(
    (name, _reader(name, field), not field.required and not field.allow_none)
    for name, field in TaskSchema().fields.items()
)


def task_dto(task: Task) -> dict[str, Any]:
    dto: dict[str, Any] = {}
    for key, read, optional in _READERS:
        value = read(task)
        if value is not None or not optional:
            dto[key] = value
    return dto


class _Names(fields.List):  # type: ignore[type-arg]
    """A list of names, sorted: the keys of a mapping (the workspace's
    repository paths by name) or the names themselves."""

    def _serialize(self, value: Any, attr: Any, obj: Any, **kwargs: Any) -> list[Any] | None:
        if value is None:
            return None
        return super()._serialize(sorted(value), attr, obj, **kwargs)


class WorkspaceSchema(Schema):
    id = fields.UUID(required=True)
    name = fields.String(required=True)
    task_prefix = fields.String(required=True)
    workflows = fields.Dict(keys=fields.String(), values=fields.List(fields.String()))
    wip_limit = fields.Integer(
        allow_none=True,
        required=True,
        metadata={"description": "most active tasks at once (PUT .../policy); null: no limit"},
    )
    repositories = _Names(
        fields.String(),
        required=True,
        metadata={"description": "names of the registered repositories, sorted "
                  "(with their paths: GET .../repositories)"},
    )


_WORKSPACE = WorkspaceSchema()


def workspace_dto(workspace: Workspace) -> dict[str, Any]:
    dumped: dict[str, Any] = _WORKSPACE.dump(workspace)
    return dumped
