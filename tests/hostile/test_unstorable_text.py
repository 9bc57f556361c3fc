"""Text that cannot be stored — a lone surrogate ("\\ud800", no UTF-8 form) or NUL
(no PostgreSQL text, path, argv or environment entry holds it) — in any JSON field
of any route is one typed 400 ``invalid_text`` naming the field, checked once
where the body is parsed; a repository path component the OS cannot take is 422
``invalid_path``. Each was a 500 before. Nothing is stored: the store's last
notification id does not move. A real `kandev-es serve` on both backends, and
`kandev-es mcp --http` for tool arguments."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from kandev_es.bootstrap import Services, bootstrap
from tests.support.mcp_client import call, raw_tool_call, server_env
from tests.support.served import ServedMcp, ServedProcess, http

SURROGATE = "\\ud800"  # as a JSON escape: json.dumps cannot write a lone one itself
LOW_SURROGATE = "\\udfff"
NUL = "\\u0000"


@pytest.fixture
def server(settings, tmp_path) -> Iterator[ServedProcess]:
    served = ServedProcess(settings, tmp_path)
    yield served
    served.stop()


@pytest.fixture
def store(settings, server) -> Iterator[Services]:
    """The served process's store, opened beside it to read what was written."""
    opened = bootstrap(settings.with_overrides(create_tables=False))
    yield opened
    opened.close()


def send(server: ServedProcess, method: str, path: str, template: str, **values: str) -> Any:
    """``template`` is JSON text with ``{bad}`` where the unstorable escape goes."""
    raw = template.replace("{bad}", values["bad"]).replace("{ws}", server.workspace_id)
    return http(method, server.base + path, server.token, raw=raw.encode(),
                headers={"Content-Type": "application/json"})


def listed_task_ids(server: ServedProcess) -> list[str]:
    """The workspace's task list once the projection shows at least one task."""
    url = f"{server.base}/api/v1/workspaces/{server.workspace_id}/tasks"
    deadline = time.monotonic() + 30
    while True:
        items = http("GET", url, server.token).body["items"]
        if items or time.monotonic() > deadline:
            return [item["id"] for item in items]
        time.sleep(0.1)


def bodies(task_id: str) -> list[tuple[str, str, str, str]]:
    """(method, path, body template, field named in the error) for every text
    field the issue found failing, and keys and nested values besides."""
    return [
        ("POST", "/api/v1/tasks", '{"workspace_id": "{ws}", "title": "a{bad}"}', "title"),
        ("POST", "/api/v1/tasks",
         '{"workspace_id": "{ws}", "title": "t", "description": "{bad}"}', "description"),
        ("POST", "/api/v1/tasks",
         '{"workspace_id": "{ws}", "title": "t", "attachments": ["ok", "x{bad}"]}',
         "attachments[1]"),
        ("POST", "/api/v1/tasks",
         '{"workspace_id": "{ws}", "title": "t", "repositories": ["{bad}"]}', "repositories[0]"),
        ("POST", "/api/v1/tasks", '{"workspace_id": "{ws}", "title": "t", "k{bad}": 1}',
         None),
        ("PATCH", f"/api/v1/tasks/{task_id}", '{"title": "{bad}"}', "title"),
        ("PATCH", f"/api/v1/tasks/{task_id}", '{"description": "ok {bad}"}', "description"),
        ("POST", "/api/v1/tokens", '{"workspace_id": "{ws}", "label": "{bad}"}', "label"),
        ("POST", "/api/v1/workspaces", '{"name": "w{bad}"}', "name"),
        ("POST", "/api/v1/workspaces", '{"name": "w", "task_prefix": "{bad}"}', "task_prefix"),
        ("POST", "/api/v1/workspaces/{ws}/repositories",
         '{"name": "r", "path": "/tmp/{bad}/repo"}', "path"),
        ("POST", "/api/v1/workspaces/{ws}/repositories", '{"name": "r{bad}", "path": "/tmp"}',
         "name"),
        ("PUT", "/api/v1/workspaces/{ws}/policy", '{"wip_limit": "{bad}"}', "wip_limit"),
        ("POST", "/api/v1/office/runtime/tasks", '{"title": "{bad}"}', "title"),
        ("POST", "/api/v1/agentctl/tasks", '{"title": "{bad}"}', "title"),
    ]


def test_unstorable_text_in_any_json_field_is_400_invalid_text_and_stores_nothing(
    server, store
):
    made = http("POST", server.base + "/api/v1/tasks", server.token,
                {"workspace_id": server.workspace_id, "title": "kept", "description": "d"})
    assert made.status == 200, made.body
    before = store.app.max_notification_id()
    for bad, reason in ((SURROGATE, "lone_surrogate"), (LOW_SURROGATE, "lone_surrogate"),
                        (NUL, "nul")):
        for method, path, template, field in bodies(made.body["id"]):
            path = path.replace("{ws}", server.workspace_id)
            reply = send(server, method, path, template, bad=bad)
            where = (method, path, template, bad, reply.body)
            assert reply.status == 400, where
            assert reply.body["error"] == "invalid_text", where
            assert reply.body["details"]["reason"] == reason, where
            if field is not None:
                assert reply.body["details"]["field"] == field, where
    assert store.app.max_notification_id() == before
    kept = http("GET", f"{server.base}/api/v1/tasks/{made.body['id']}", server.token)
    assert (kept.body["title"], kept.body["description"]) == ("kept", "d")
    assert listed_task_ids(server) == [made.body["id"]]
    assert "internal_error" not in server.output()  # no 500 was logged either


def test_surrogates_pairs_and_nul_lookalikes_stay_ordinary_text(server, store):
    """A surrogate pair is one character, and an escaped backslash before
    ``u0000`` is text: both are stored and read back unchanged."""
    made = send(server, "POST", "/api/v1/tasks",
                '{"workspace_id": "{ws}", "title": "{bad} ok", "description": "\\\\u0000"}',
                bad="\\ud83d\\ude00")
    assert made.status == 200, made.body
    read = http("GET", f"{server.base}/api/v1/tasks/{made.body['id']}", server.token)
    assert (read.body["title"], read.body["description"]) == ("\U0001f600 ok", "\\u0000")


def test_nul_or_surrogate_external_id_keeps_its_documented_error(server, store):
    """docs/api.md External ID rules: control characters and lone surrogates in the
    external ID are ``invalid_external_id`` with their reason."""
    before = store.app.max_notification_id()
    for bad, reason in ((NUL, "control_character"), (SURROGATE, "invalid_unicode")):
        reply = send(server, "POST", "/api/v1/tasks",
                     '{"workspace_id": "{ws}", "title": "t", "external_id": "J{bad}"}', bad=bad)
        assert (reply.status, reply.body["error"]) == (400, "invalid_external_id"), reply.body
        assert reply.body["details"]["reason"] == reason
    assert store.app.max_notification_id() == before


def test_repository_path_the_os_cannot_take_is_422_invalid_path(server, store, settings):
    root = settings.repository_roots[0]
    before = store.app.max_notification_id()
    url = f"{server.base}/api/v1/workspaces/{server.workspace_id}/repositories"
    for path in (f"{root}/{'a' * 300}", f"{root}/{'é' * 128}",
                 str(root) + "/ab" * 2100):
        reply = http("POST", url, server.token, {"name": "r", "path": path})
        assert (reply.status, reply.body["error"]) == (422, "invalid_path"), (path, reply.body)
        assert reply.body["details"]["field"] == "path"
    assert store.app.max_notification_id() == before
    listed = http("GET", url, server.token)
    assert listed.status == 200 and listed.body == []


def test_numbers_that_are_not_finite_are_400_malformed_json(server, store):
    before = store.app.max_notification_id()
    url = f"/api/v1/workspaces/{server.workspace_id}/policy"
    for number in ("1e400", "NaN", "-Infinity", "1" + "0" * 400 + ".5"):
        reply = send(server, "PUT", url, '{"wip_limit": {bad}}', bad=number)
        assert (reply.status, reply.body["error"]) == (400, "malformed_json"), (number, reply.body)
    assert store.app.max_notification_id() == before


@pytest.mark.anyio
async def test_mcp_tool_arguments_get_the_same_check(settings, services, workspace, member,
                                                      tmp_path):
    """Over `kandev-es mcp --http` the SDK parses the JSON; NUL, NaN and 1e400,
    which its parser lets through, reach the same check as a REST body (a lone
    surrogate escape is refused by the SDK's parser before any tool runs)."""
    _, secret = member
    with ServedMcp(settings, tmp_path, **server_env(settings)) as served:
        before = services.app.max_notification_id()
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {secret}"}) as client:
            transport = streamable_http_client(served.url, http_client=client)
            async with Client(transport, read_timeout_seconds=30) as mcp:
                replies = [
                    await call(mcp, "create_task_kandev", title="a\x00", start_agent=False),
                    await call(mcp, "create_task_kandev", title="t", attachments=["\x00"]),
                    await call(mcp, "update_task", task_id=str(workspace.id), title="\x00"),
                ]
        raw = [raw_tool_call(served.url, secret, "create_task_kandev", arguments) for arguments in (
            '{"title": "a\\ud800"}', '{"title": "t", "description": 1e400}',
            '{"title": "t", "x": NaN}',
        )]
    for error, body in replies:
        assert error and (body["error"], body["status"]) == ("invalid_text", 400), body
        assert body["details"]["reason"] == "nul"
    # The SDK's own parser refuses a lone surrogate escape: HTTP 400, JSON-RPC parse error.
    assert (raw[0][0], raw[0][1]["error"]["code"]) == (400, -32700), raw[0]
    for status, body in raw[1:]:
        result = body["result"]
        assert status == 200 and result["isError"], body
        assert (result["structuredContent"]["error"], result["structuredContent"]["status"]) == (
            "malformed_json", 400), body
    assert services.app.max_notification_id() == before
    assert json.loads(json.dumps(replies))  # the answers themselves encode
