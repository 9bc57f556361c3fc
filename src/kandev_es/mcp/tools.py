"""The tools this server offers: names, descriptions and input schemas.

There is deliberately no lookup/probe tool and no release tool (docs/api.md:
Entry points; "The one unsafe thing"). The input schemas are
published for callers; arguments reach the create protocol unvalidated, so the
identity lookup runs before any request-specific validation (AC-4)."""

from __future__ import annotations

from typing import Any

from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin
from marshmallow import RAISE, Schema, fields, validate
from mcp_types import Tool, ToolAnnotations

from kandev_es.creation.outcomes import CreateTaskResponseSchema
from kandev_es.creation.request import CreateTaskRequestSchema
from kandev_es.limits import MAX_CURSOR, MAX_LIST_LIMIT
from kandev_es.services.tasks import TaskPatchSchema
from kandev_es.views import TaskSchema

CREATE_TASK = "create_task_kandev"
GET_TASK = "get_task"
LIST_TASKS = "list_tasks"
UPDATE_TASK = "update_task"

SAFETY_STATEMENT = (
    "deduplicated=true with creation_complete=false means another create owns this "
    "identity and has not finished: proceed with the returned task id, or escalate to a "
    "human. NEVER release the identity and create again: that is the one unsafe move, "
    "and it produces a duplicate task and a duplicate running agent."
)

CREATE_DESCRIPTION = f"""Create a Kandev task: create-if-absent, idempotent by external_id.

This is NOT a probe or a lookup. With an external_id, if a task in the workspace \
already holds that identity you get that task back unchanged and nothing is created \
or validated; if no task holds it, this call CREATES one (and, with start_agent, \
launches an agent). MCP has no side-effect-free lookup tool.
Without external_id every call creates a new task. The system never generates an \
external_id: mint one (a Jira key, a webhook delivery id, a UUID) before your first \
attempt and send the same value on every retry.

The result is the task plus:
- outcome: created | found_settled | found_unsettled | created_identity_lost.
- deduplicated: true when an existing task was returned and nothing was created \
(found_settled, found_unsettled); false when this call created the task.
- creation_complete: true when the returned task finished its required creation \
work (it says nothing about whether an agent is still running); false only for \
found_unsettled.
{SAFETY_STATEMENT} Repeating this same create later is safe.

Workspace: workspace_id if given, else the parent task's (parent_id), else the \
token's workspace, else the only workspace when exactly one exists. start_agent \
defaults to true. Errors come back with isError=true and structured content \
{{"error": <machine-readable code>, "status": <HTTP-like status>, "message", \
"details"}}, e.g. "task not created" (404: unknown workspace or not authorized), \
invalid_external_id (400), validation_failed / unknown_reference (422)."""

_UUID = {"type": "string", "format": "uuid"}

# What MCP says beyond the REST body: richer descriptions, and start_agent
# defaults to true here (mcp/handlers.py). Types and limits come from the
# marshmallow schema that validates the create, so the two cannot drift.
_CREATE_OVERLAY: dict[str, dict[str, Any]] = {
    "external_id": {
        "description": "your stable identity for this task: at most 255 UTF-8 bytes, "
        "no control characters; surrounding whitespace is trimmed; empty means absent",
    },
    "workspace_id": {"description": "target workspace (see resolution order)"},
    "workflow": {"description": "default: 'default'"},
    "workflow_step": {"description": "default: the workflow's first"},
    "repositories": {"description": "names of registered repositories"},
    "attachments": {"description": "uploaded attachments, 'sha256:<hex>'"},
    "parent_id": {"description": "parent task; never passes on its external_id"},
    "start_agent": {"default": True},
}


def _json_schema(schema: type[Schema]) -> dict[str, Any]:
    """A marshmallow schema as JSON Schema, exactly as OpenAPI publishes it."""
    plugin = MarshmallowPlugin()
    APISpec("kandev-es MCP", "1", "3.1.0", plugins=[plugin])  # initialises the converter
    assert plugin.converter is not None
    converted: dict[str, Any] = plugin.converter.schema2jsonschema(  # type: ignore[no-untyped-call]
        schema
    )
    return converted


def _create_schema() -> dict[str, Any]:
    schema = _json_schema(CreateTaskRequestSchema)
    for name, extra in _CREATE_OVERLAY.items():
        schema["properties"][name] = schema["properties"][name] | extra
    return schema


CREATE_SCHEMA: dict[str, Any] = _create_schema()

# What the tools answer, from the schemas REST publishes (the create answer of
# creation/outcomes.py; the one task representation of views.py), so an MCP
# client can check every answer against the same contract.
CREATE_OUTPUT_SCHEMA: dict[str, Any] = _json_schema(CreateTaskResponseSchema)
TASK_OUTPUT_SCHEMA: dict[str, Any] = _json_schema(TaskSchema)
LIST_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "items": {"type": "array", "items": TASK_OUTPUT_SCHEMA},
        "next_cursor": {"type": ["integer", "null"], "description": "null on the last page"},
        "has_more": {"type": "boolean", "description": "another page follows next_cursor"},
    },
    "required": ["items", "next_cursor", "has_more"],
}

TASK_ID_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"task_id": _UUID},
    "required": ["task_id"],
    "additionalProperties": False,
}

class ListTasksArguments(Schema):
    """list_tasks' arguments: REST's list query (api/tasks.py
    TaskListQuerySchema) without external_id (no lookup by filter), JSON
    integers only, and the workspace as an argument."""

    class Meta:
        unknown = RAISE

    workspace_id = fields.UUID(
        load_default=None,
        allow_none=True,
        metadata={"description": "default: the token's or the only workspace"},
    )
    after = fields.Integer(
        load_default=0,
        strict=True,
        validate=validate.Range(min=0, max=MAX_CURSOR),
        metadata={"description": "cursor: next_cursor"},
    )
    limit = fields.Integer(
        load_default=50, strict=True, validate=validate.Range(min=1, max=MAX_LIST_LIMIT)
    )
    include_archived = fields.Boolean(load_default=True)


LIST_SCHEMA: dict[str, Any] = _json_schema(ListTasksArguments)

def _update_schema() -> dict[str, Any]:
    """The task patch (services/tasks.py TaskPatchSchema, what REST's PATCH
    validates with) plus the task id and the revision guard."""
    schema = _json_schema(TaskPatchSchema)
    schema["properties"] = {
        "task_id": _UUID,
        **schema["properties"],
        "if_revision": {"type": "integer", "description": "fail unless the task is at it"},
    }
    schema["required"] = ["task_id"]
    return schema


UPDATE_SCHEMA: dict[str, Any] = _update_schema()

TOOLS = [
    Tool(
        name=CREATE_TASK,
        title="Create a task (create-if-absent by external_id)",
        description=CREATE_DESCRIPTION,
        input_schema=CREATE_SCHEMA,
        output_schema=CREATE_OUTPUT_SCHEMA,
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False),
    ),
    Tool(
        name=GET_TASK,
        title="Get a task",
        description="One task by id, read from the event store (always your own writes). "
        "external_id is present only while the task holds one.",
        input_schema=TASK_ID_SCHEMA,
        output_schema=TASK_OUTPUT_SCHEMA,
        annotations=ToolAnnotations(read_only_hint=True),
    ),
    Tool(
        name=LIST_TASKS,
        title="List tasks",
        description="Tasks of a workspace, oldest first, from the read model (may lag "
        "creates by the projection delay). Not a lookup: to make sure a task exists for "
        "an external_id, call create_task_kandev with it; never decide from a list.",
        input_schema=LIST_SCHEMA,
        output_schema=LIST_OUTPUT_SCHEMA,
        annotations=ToolAnnotations(read_only_hint=True),
    ),
    Tool(
        name=UPDATE_TASK,
        title="Update a task",
        description="Change title, description or workflow_step of a task whose creation "
        "finished. external_id is immutable: passing it is an error "
        "(external_id_immutable).",
        input_schema=UPDATE_SCHEMA,
        output_schema=TASK_OUTPUT_SCHEMA,
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False),
    ),
]
