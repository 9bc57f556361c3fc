"""`kandev-es mcp --http`: the streamable-HTTP transport, spoken to by the SDK's
own client. Each call acts with its request's Authorization header; without
one (or with another workspace's token) a create is "task not created"."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.support.mcp_client import call, server_env

pytestmark = pytest.mark.anyio
CREATE = "create_task_kandev"
WAIT_S = 20.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def mcp_url(settings, services) -> Iterator[str]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KANDEV_")}
    env.update(server_env(settings))
    log = (settings.data_dir.parent / "mcp-http.log").open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "kandev_es.cli", "mcp", "--http", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            assert process.poll() is None, "mcp --http exited early"
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "mcp --http did not start listening"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


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
