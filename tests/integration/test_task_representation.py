"""REST and MCP answer one task representation: the REST task body (dumped
through TaskSchema by the route) and the MCP tools' task output have the same
fields and values, for a task holding an external ID and one holding none, and
the MCP tools publish TaskSchema as their output schema (the SDK client checks
every successful answer against it). The server `kandev-es mcp` runs, connected
in-process (its stdio process: test_mcp_create, test_mcp_authorization); both backends."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from kandev_es.creation.outcomes import CreateTaskResponseSchema
from kandev_es.views import TaskSchema
from tests.conftest import bearer
from tests.support.mcp_client import call, mcp_in_process

pytestmark = pytest.mark.anyio
CREATE = "create_task_kandev"


async def test_rest_and_mcp_return_the_same_task_body(settings, services, client, member):
    _, secret = member
    async with mcp_in_process(settings, secret) as mcp:
        _, held = await call(mcp, CREATE, title="Held", external_id="R-1", start_agent=False)
        _, plain = await call(mcp, CREATE, title="Plain", start_agent=False)
        _, mcp_held = await call(mcp, "get_task", task_id=held["id"])
        _, mcp_plain = await call(mcp, "get_task", task_id=plain["id"])
        _, mcp_found = await call(mcp, CREATE, title="again", external_id="R-1")
        _, mcp_updated = await call(mcp, "update_task", task_id=plain["id"], title="Plainer")
        deadline = time.monotonic() + 15
        while True:  # the list is a read model: it lags by the projection delay
            _, listing = await call(mcp, "list_tasks", limit=10)
            titles = {item["title"] for item in listing["items"]}
            if titles == {"Held", "Plainer"} or time.monotonic() > deadline:
                break
            await anyio.sleep(0.1)

    def rest_task(task_id: str) -> dict[str, Any]:
        response = client.get(f"/api/v1/tasks/{task_id}", headers=bearer(secret))
        assert response.status_code == 200
        return dict(response.json)

    rest_held, rest_plain = rest_task(held["id"]), rest_task(plain["id"])
    # ``forgotten`` is present only on a forgotten task (tests/integration/test_forget.py).
    shown = set(TaskSchema().fields) - {"forgotten"}
    assert set(rest_held) == set(mcp_held) == shown
    assert set(rest_plain) == set(mcp_plain) == shown - {"external_id"}
    assert rest_held == mcp_held
    assert rest_plain == mcp_updated  # the update answers the task as it now is

    found = client.post(
        "/api/v1/tasks", json={"title": "again", "external_id": "R-1"}, headers=bearer(secret)
    ).json
    assert found["outcome"] == mcp_found["outcome"] == "found_settled"
    assert found == mcp_found

    rest_listing = client.get(
        f"/api/v1/workspaces/{held['workspace_id']}/tasks", headers=bearer(secret)
    ).json
    assert rest_listing == listing
    assert {item["id"]: item for item in listing["items"]} == {
        held["id"]: rest_held, plain["id"]: rest_plain,
    }


async def test_the_mcp_task_tools_publish_the_task_schema_as_their_output(
    settings, services, member
):
    _, secret = member
    async with mcp_in_process(settings, secret) as mcp:
        listed = {tool.name: tool for tool in (await mcp.list_tools()).tools}
    declared = TaskSchema().fields
    required = {name for name, field in declared.items() if field.required}
    for name in ("get_task", "update_task"):
        output = listed[name].output_schema
        assert output is not None, name
        assert set(output["properties"]) == set(declared), name
        assert set(output["required"]) == required == set(declared) - {"external_id", "forgotten"}
    listing = listed["list_tasks"].output_schema
    assert listing is not None
    assert listing["properties"]["items"]["items"] == listed["get_task"].output_schema
    create = listed["create_task_kandev"].output_schema
    assert create is not None
    assert set(create["properties"]) == set(CreateTaskResponseSchema().fields)
    assert set(declared) < set(create["properties"])
