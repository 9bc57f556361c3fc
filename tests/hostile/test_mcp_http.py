"""`kandev-es mcp --http`: the streamable-HTTP transport, spoken to by the SDK's
own client. Each call acts with its request's Authorization header; another
workspace's token gets "task not created". A request without a token that
authenticates is refused 401 `unauthenticated` before the SDK sees it, and the
server keeps no sessions: a flood of token-less `initialize` calls holds nothing,
and a token holder gets only POST (no GET stream held open until it leaves)."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from kandev_es.errors import NOT_VALID_FOR_WORKSPACE
from tests.support.errors import without_request_id
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
    async with _client(mcp_url, stranger, mode) as client:
        error, body = await call(client, CREATE, title="t", external_id="H-1",
                                 workspace_id=str(workspace.id))
    assert created["outcome"] == "created" and created["workspace_id"] == str(workspace.id)
    assert found["outcome"] == "found_settled" and found["id"] == created["id"]
    assert read["external_id"] == "H-1"
    assert error and without_request_id(body) == {
        "error": "task not created", "message": NOT_VALID_FOR_WORKSPACE, "status": 404
    }
    assert services.app.max_notification_id() == before


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "flood", "version": "0"},
    },
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream"}


def _initialize(http: httpx.Client, url: str, authorization: str | None) -> httpx.Response:
    headers = dict(MCP_HEADERS)
    if authorization is not None:
        headers["Authorization"] = authorization
    return http.post(url, json=INITIALIZE, headers=headers)


UNAUTHENTICATED = [None, "Bearer", "Basic a2FuZGV2OmVz", "Bearer garbage", "Bearer kes_" + "A" * 43]


def test_initialize_without_a_valid_token_is_refused_401_before_any_session(
    settings, services, mcp_url
):
    # One served process for every case (each of its own cost a process start).
    for authorization in UNAUTHENTICATED:
        with httpx.Client(timeout=30) as http:
            answer = _initialize(http, mcp_url, authorization)
        assert answer.status_code == 401, authorization
        assert answer.json()["error"] == "unauthenticated", authorization
        assert answer.headers["www-authenticate"] == "Bearer", authorization
        assert "mcp-session-id" not in answer.headers, authorization


def test_a_revoked_token_is_refused_at_the_door(settings, services, member, mcp_url):
    token, secret = member
    with httpx.Client(timeout=30) as http:
        before = _initialize(http, mcp_url, f"Bearer {secret}")
        services.tokens.revoke(token.token_id)
        after = _initialize(http, mcp_url, f"Bearer {secret}")
    assert before.status_code == 200 and "mcp-session-id" not in before.headers
    assert after.status_code == 401 and after.json()["error"] == "unauthenticated"


def test_a_token_holder_gets_only_post_so_no_stream_is_held_open(
    settings, services, member, mcp_url
):
    _, secret = member
    headers = {"Authorization": f"Bearer {secret}", "Accept": "text/event-stream"}
    for method in ("GET", "DELETE", "PUT"):
        with httpx.Client(timeout=10) as http:
            answer = http.request(method, mcp_url, headers=headers)
        assert answer.status_code == 405, method
        assert answer.json()["error"] == "method_not_allowed", method
        assert answer.headers["allow"] == "POST", method


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


# A session the server kept cost about 37 KiB (10,000 moved the RSS 93 -> 461 MB
# before the gate): 2,400 would hold about 88 MB, three times the margin, so a
# larger flood proves nothing more (it took 30 s a backend).
FLOOD = 2_400
FLOOD_THREADS = 8
RSS_MARGIN_KIB = 30 * 1024


async def test_a_flood_of_unauthenticated_initializes_holds_nothing_and_a_token_still_gets_in(
    settings, services, member, tmp_path
):
    _, secret = member
    with ServedMcp(settings, tmp_path, **server_env(settings)) as served:
        kinds = [None, "Bearer garbage", None, "Bearer kes_" + secrets.token_urlsafe(32)]

        def flood(count: int) -> list[int]:
            with httpx.Client(timeout=30) as http:
                return [
                    _initialize(http, served.url, kinds[i % len(kinds)]).status_code
                    for i in range(count)
                ]

        flood(200)  # warm: imports, thread pool, allocator arenas
        before = _rss_kib(served.process.pid)
        with ThreadPoolExecutor(FLOOD_THREADS) as pool:
            statuses = [
                status
                for batch in pool.map(flood, [FLOOD // FLOOD_THREADS] * FLOOD_THREADS)
                for status in batch
            ]
        after = _rss_kib(served.process.pid)
        async with _client(served.url, secret, "legacy") as client:
            _, created = await call(client, CREATE, title="after the flood",
                                    external_id="FLOOD-1", start_agent=False)
    assert len(statuses) == FLOOD and set(statuses) == {401}
    assert after - before < RSS_MARGIN_KIB, (before, after)
    assert created["outcome"] == "created"
