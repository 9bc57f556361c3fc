"""Driving the real MCP server process with the SDK's own client."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from kandev_es.config import Settings


def server_env(settings: Settings, token: str | None = None) -> dict[str, str]:
    env = {
        "KANDEV_DATA_DIR": str(settings.data_dir),
        "KANDEV_CREATE_TABLES": "0",  # the `services` fixture created them
        "KANDEV_PROJECTION_POLL_SECONDS": "0.05",
        "KANDEV_DEMO_AGENT_SECONDS": "1",
    }
    if settings.database_url:
        env["KANDEV_DATABASE_URL"] = settings.database_url
    if token is not None:
        env["KANDEV_TOKEN"] = token
    return env


@asynccontextmanager
async def mcp_stdio(settings: Settings, token: str | None) -> AsyncIterator[Client]:
    """`kandev-es mcp` as a subprocess, acting with `token` (KANDEV_TOKEN)."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "kandev_es.cli", "mcp"],
        env=server_env(settings, token),
        cwd=str(settings.data_dir.parent),
    )
    log_path = settings.data_dir.parent / "mcp-server.log"
    with log_path.open("a", encoding="utf-8") as errlog:
        async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=60) as client:
            yield client


@asynccontextmanager
async def mcp_in_process(settings: Settings, token: str | None) -> AsyncIterator[Client]:
    """The server `kandev-es mcp` runs over stdio (build_server on services of
    its own, acting with ``token``, its projection loop in a thread, demo agents
    of 1 s), connected by the SDK's in-memory transport: every tool and its
    JSON-RPC answers as the process gives them, without a process start per
    test (~2 s of CPU importing the SDK and the store). What only the process
    does (KANDEV_TOKEN read from its environment, stdio framing, its own store
    setup) is `mcp_stdio`'s."""
    from kandev_es.agent.census import running_launches
    from kandev_es.agent.processes import stop_run
    from kandev_es.bootstrap import bootstrap
    from kandev_es.config import data_path
    from kandev_es.mcp.server import build_server

    services = bootstrap(settings.with_overrides(projection_poll_seconds=0.05))
    agent_seconds = os.environ.get("KANDEV_DEMO_AGENT_SECONDS")
    os.environ["KANDEV_DEMO_AGENT_SECONDS"] = "1"  # what server_env gives the process
    try:
        services.projections.start_thread(services.settings.projection_poll_seconds)
        server = build_server(services, lambda ctx: token)
        async with Client(server, read_timeout_seconds=60) as client:
            yield client
    finally:
        # Its agents end with it, as they would with the process: none outlives the test.
        for launch in running_launches(data_path(services.settings, "agents")):
            stop_run(launch.run_id)
        if agent_seconds is None:
            os.environ.pop("KANDEV_DEMO_AGENT_SECONDS", None)
        else:
            os.environ["KANDEV_DEMO_AGENT_SECONDS"] = agent_seconds
        services.close()


async def call(client: Client, tool: str, **arguments: Any) -> tuple[bool, dict[str, Any]]:
    """(is_error, structured content) of one tool call."""
    result = await client.call_tool(tool, arguments)
    assert result.structured_content is not None, result
    return bool(result.is_error), dict(result.structured_content)


def raw_tool_call(url: str, secret: str, tool: str, arguments: str) -> tuple[int, Any]:
    """One ``tools/call`` on the stateless `mcp --http` endpoint whose
    arguments are the JSON text given (what the SDK's client cannot send: a lone
    surrogate escape, NaN, 1e400): the HTTP status and the JSON-RPC answer."""
    envelope = ('{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": '
                '{"name": TOOL, "arguments": ARGUMENTS}}')
    body = envelope.replace("TOOL", json.dumps(tool)).replace("ARGUMENTS", arguments)
    reply = httpx.post(url, content=body.encode(), timeout=20, headers={
        "Authorization": f"Bearer {secret}", "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18",
    })
    text = reply.text
    if text.startswith("event:"):  # one server-sent event carrying the JSON-RPC answer
        text = next(line[5:] for line in text.splitlines() if line.startswith("data:"))
    return reply.status_code, json.loads(text) if text.strip() else None
