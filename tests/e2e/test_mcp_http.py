"""`kandev-es mcp --http`: the streamable-HTTP transport, spoken to by the SDK's
own client. Each call acts with its request's Authorization header; without
one (or with another workspace's token) a create is "task not created"."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.support.mcp_client import call, server_env
from tests.support.served import ServedMcp

pytestmark = pytest.mark.anyio
CREATE = "create_task_kandev"


@pytest.fixture
def mcp_url(settings, services, tmp_path) -> Iterator[str]:
    with ServedMcp(settings, tmp_path, **server_env(settings)) as served:
        yield served.url


@asynccontextmanager
async def _client(url: str, secret: str | None, mode: str) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    async with httpx2.AsyncClient(headers=headers) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode=mode, read_timeout_seconds=30) as client:
            yield client


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_each_request_acts_with_its_authorization_header(
    settings, services, workspace, member, mcp_url, mode
):
    _, secret = member
    globex = services.workspaces.open("globex")
    stranger, _ = services.tokens.issue(workspace_id=globex.id, admin=False)
    async with _client(mcp_url, secret, mode) as client:
        _, created = await call(client, CREATE, title="Over HTTP", external_id="H-1",
                                start_agent=False)
        _, found = await call(client, CREATE, title="again", external_id="H-1")
        _, read = await call(client, "get_task", task_id=created["id"])
    before = services.app.max_notification_id()
    refusals = []
    for token in (None, stranger):
        async with _client(mcp_url, token, mode) as client:
            refusals.append(await call(client, CREATE, title="t", external_id="H-1",
                                       workspace_id=str(workspace.id)))
    assert created["outcome"] == "created" and created["workspace_id"] == str(workspace.id)
    assert found["outcome"] == "found_settled" and found["id"] == created["id"]
    assert read["external_id"] == "H-1"
    for error, body in refusals:
        assert error and body == {"error": "task not created", "status": 404}
    assert services.app.max_notification_id() == before
