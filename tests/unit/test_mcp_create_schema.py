"""The MCP create tool's input schema is generated from the marshmallow schema
that validates a create, so its types and limits cannot drift from REST's."""

from __future__ import annotations

from typing import Any

from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin
from marshmallow import Schema

from kandev_es.creation.request import CreateTaskRequestSchema
from kandev_es.mcp.tools import CREATE_SCHEMA, UPDATE_SCHEMA
from kandev_es.services.tasks import TaskPatchSchema

LIMITS = ("type", "format", "minLength", "maxLength", "maxItems", "items")


def _rest_schema(schema_class: type[Schema] = CreateTaskRequestSchema) -> dict[str, Any]:
    plugin = MarshmallowPlugin()
    APISpec("t", "1", "3.1.0", plugins=[plugin])
    assert plugin.converter is not None
    schema: dict[str, Any] = plugin.converter.schema2jsonschema(schema_class)
    return schema


def test_create_tool_offers_exactly_the_rest_fields() -> None:
    rest = _rest_schema()
    assert set(CREATE_SCHEMA["properties"]) == set(rest["properties"])
    assert CREATE_SCHEMA["required"] == rest["required"] == ["title"]
    assert CREATE_SCHEMA["additionalProperties"] is False


def test_create_tool_limits_match_the_rest_validation() -> None:
    rest = _rest_schema()["properties"]
    for name, field in CREATE_SCHEMA["properties"].items():
        for key in LIMITS:
            assert field.get(key) == rest[name].get(key), (name, key)


def test_create_tool_publishes_the_length_and_item_limits() -> None:
    properties = CREATE_SCHEMA["properties"]
    assert properties["title"]["maxLength"] == 500
    assert properties["description"]["maxLength"] == 100_000
    assert properties["repositories"]["maxItems"] == 20
    assert properties["repositories"]["items"]["maxLength"] == 200
    assert properties["attachments"]["maxItems"] == 50
    assert properties["start_agent"]["default"] is True  # MCP's default; REST's is false


def test_update_tool_takes_the_patch_fields_and_limits_of_rest() -> None:
    """update_task's schema is the PATCH body's (TaskPatchSchema) plus the task
    id and the revision guard: no field or limit of its own."""
    rest = _rest_schema(TaskPatchSchema)["properties"]
    properties = UPDATE_SCHEMA["properties"]
    assert set(properties) == set(rest) | {"task_id", "if_revision"}
    for name, field in rest.items():
        assert properties[name] == field, name
    assert properties["description"]["maxLength"] == 100_000
    assert properties["workflow_step"]["maxLength"] == 100
    assert UPDATE_SCHEMA["required"] == ["task_id"]
    assert UPDATE_SCHEMA["additionalProperties"] is False


def test_list_tool_takes_the_rest_list_query_limits_without_external_id() -> None:
    """list_tasks validates with the schema it publishes (ListTasksArguments), and
    its limits are REST's list query's; external_id is left out (no lookup)."""
    from kandev_es.api.tasks import TaskListQuerySchema
    from kandev_es.mcp.tools import LIST_SCHEMA, ListTasksArguments

    assert _rest_schema(ListTasksArguments) == LIST_SCHEMA
    rest = _rest_schema(TaskListQuerySchema)["properties"]
    properties = LIST_SCHEMA["properties"]
    assert set(properties) == set(rest) - {"external_id"} | {"workspace_id"}
    for name in set(rest) - {"external_id"}:
        for key in ("type", "default", "minimum", "maximum"):
            assert properties[name].get(key) == rest[name].get(key), (name, key)
    assert LIST_SCHEMA["additionalProperties"] is False
