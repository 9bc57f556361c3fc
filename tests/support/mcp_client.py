"""Driving the real MCP server process with the SDK's own client."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

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


async def call(client: Client, tool: str, **arguments: Any) -> tuple[bool, dict[str, Any]]:
    """(is_error, structured content) of one tool call."""
    result = await client.call_tool(tool, arguments)
    assert result.structured_content is not None, result
    return bool(result.is_error), dict(result.structured_content)
