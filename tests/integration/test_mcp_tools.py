"""The MCP tool surface: no probe and no release tool, the create tool states
its contract, and get/list/update speak the task representation."""

from __future__ import annotations

import time

import anyio
import pytest

from tests.support.mcp_client import call, mcp_in_process

pytestmark = pytest.mark.anyio
CREATE = "create_task_kandev"


async def test_tool_list_offers_no_lookup_probe_or_release_tool(settings, services, member):
    _, secret = member
    async with mcp_in_process(settings, secret) as client:
        listed = (await client.list_tools()).tools
    names = {tool.name for tool in listed}
    assert names == {"create_task_kandev", "get_task", "list_tasks", "update_task"}
    for forbidden in ("lookup", "probe", "find", "release", "by_external", "exists"):
        assert not any(forbidden in name for name in names)
    list_tool = next(tool for tool in listed if tool.name == "list_tasks")
    assert "external_id" not in list_tool.input_schema["properties"]  # no lookup by filter


async def test_create_tool_describes_create_if_absent_and_the_one_unsafe_move(
    settings, services, member
):
    _, secret = member
    async with mcp_in_process(settings, secret) as client:
        listed = (await client.list_tools()).tools
    tool = next(tool for tool in listed if tool.name == CREATE)
    text = tool.description or ""
    assert "create-if-absent" in text and "NOT a probe" in text
    assert "deduplicated" in text and "creation_complete" in text
    assert "deduplicated=true with creation_complete=false" in text
    assert "proceed with the returned task id, or escalate" in text
    assert "NEVER release the identity and create again" in text
    assert "never generates an external_id" in text
    schema = tool.input_schema
    assert schema["required"] == ["title"]
    assert schema["properties"]["start_agent"]["default"] is True
    assert {"workspace_id", "external_id", "parent_id", "repositories", "attachments"} <= set(
        schema["properties"]
    )
    # The limits of the marshmallow schema REST validates with reach the tool
    # a client lists.
    properties = schema["properties"]
    assert properties["title"]["maxLength"] == 500
    assert properties["description"]["maxLength"] == 100_000
    assert properties["repositories"]["maxItems"] == 20
    assert properties["repositories"]["items"]["maxLength"] == 200
    assert properties["attachments"]["maxItems"] == 50
    assert schema["additionalProperties"] is False
    update = next(tool for tool in listed if tool.name == "update_task").input_schema
    assert update["properties"]["description"]["maxLength"] == 100_000
    assert update["properties"]["workflow_step"]["maxLength"] == 100


async def test_get_task_includes_external_id_only_while_held(
    settings, services, workspace, member
):
    _, secret = member
    async with mcp_in_process(settings, secret) as client:
        _, held = await call(client, CREATE, title="Held", external_id="G-1", start_agent=False)
        _, plain = await call(client, CREATE, title="Plain", start_agent=False)
        _, read_held = await call(client, "get_task", task_id=held["id"])
        _, read_plain = await call(client, "get_task", task_id=plain["id"])
        missing_error, missing = await call(client, "get_task", task_id="not-a-uuid")
    assert read_held["external_id"] == "G-1" and read_held["title"] == "Held"
    assert "external_id" not in read_plain
    assert "outcome" not in read_held  # the task representation, not a create answer
    assert missing_error and (missing["error"], missing["status"]) == ("bad_request", 400)


async def test_update_task_edits_fields_and_rejects_external_id(
    settings, services, workspace, member
):
    _, secret = member
    async with mcp_in_process(settings, secret) as client:
        _, task = await call(client, CREATE, title="Before", external_id="U-1", start_agent=False)
        _, updated = await call(client, "update_task", task_id=task["id"], title="After",
                                if_revision=task["revision"])
        before = services.app.max_notification_id()
        immutable_error, immutable = await call(
            client, "update_task", task_id=task["id"], external_id="U-2"
        )
        stale_error, stale = await call(client, "update_task", task_id=task["id"],
                                        title="Again", if_revision=task["revision"])
        _, retry = await call(client, CREATE, title="x", external_id="U-1")
    assert updated["title"] == "After" and updated["revision"] == task["revision"] + 1
    assert updated["external_id"] == "U-1"
    assert immutable_error and (immutable["error"], immutable["status"]) == (
        "external_id_immutable", 400,
    )
    assert stale_error and (stale["error"], stale["status"]) == ("revision_mismatch", 412)
    assert services.app.max_notification_id() == before
    assert retry["outcome"] == "found_settled" and retry["title"] == "After"


async def test_list_tasks_shows_the_workspace_tasks_with_their_external_ids(
    settings, services, workspace, member
):
    _, secret = member
    async with mcp_in_process(settings, secret) as client:
        _, held = await call(client, CREATE, title="One", external_id="L-1", start_agent=False)
        _, plain = await call(client, CREATE, title="Two", start_agent=False)
        deadline = time.monotonic() + 15
        while True:  # the list is a read model: it lags by the projection delay
            _, listing = await call(client, "list_tasks", limit=10)
            if len(listing["items"]) == 2 or time.monotonic() > deadline:
                break
            await anyio.sleep(0.1)
        bad_error, bad = await call(client, "list_tasks", limit=0)
    items = {item["id"]: item for item in listing["items"]}
    assert set(items) == {held["id"], plain["id"]}
    assert items[held["id"]]["external_id"] == "L-1"
    assert "external_id" not in items[plain["id"]]
    assert listing["next_cursor"] is None
    assert bad_error and (bad["error"], bad["status"]) == ("validation_failed", 422)
