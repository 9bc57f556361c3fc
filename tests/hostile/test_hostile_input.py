"""Hostile input against a real `kandev-es serve` process: deep JSON,
out-of-range cursors, unbounded policy numbers and invalid UTF-8 each get a
typed 4xx JSON error, never a 500 or a torn stream, and change nothing. On both
backends."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest

from kandev_es.limits import MAX_CURSOR, MAX_JSON_DEPTH
from tests.support.served import ServedProcess, http

TOO_BIG = str(MAX_CURSOR + 1)  # 9223372036854775808: overflowed the drivers before


def raw_request(
    method: str, url: str, token: str | None, data: bytes | None = None, **headers: str
) -> tuple[int, dict[str, str], Any]:
    sent = dict(headers)
    if token:
        sent["Authorization"] = f"Bearer {token}"
    if data is not None:
        sent["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, method=method, headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            status, got, text = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        status, got, text = error.code, dict(error.headers), error.read()
    return status, got, json.loads(text)


def nested(depth: int) -> bytes:
    return b'{"workspace_id": ' + b"[" * depth + b"]" * depth + b"}"


@pytest.fixture
def server(settings, tmp_path):
    served = ServedProcess(settings, tmp_path)
    yield served
    served.stop()


def test_json_nested_past_the_depth_limit_is_400_malformed_json_on_every_json_route(server):
    made = http(
        "POST", server.base + "/api/v1/tasks", server.token,
        {"workspace_id": server.workspace_id, "title": "kept"},
    )
    assert made.status == 200, made.body
    task_id = made.body["id"]
    ws = server.workspace_id
    routes = [
        ("POST", "/api/v1/tasks"),
        ("PATCH", f"/api/v1/tasks/{task_id}"),
        ("POST", "/api/v1/tokens"),
        ("POST", "/api/v1/workspaces"),
        ("PUT", f"/api/v1/workspaces/{ws}/policy"),
        ("POST", f"/api/v1/workspaces/{ws}/repositories"),
    ]
    for method, path in routes:
        for body in (nested(1000), nested(MAX_JSON_DEPTH + 1), b"[" * 100_000):
            status, _, reply = raw_request(method, server.base + path, server.token, body)
            assert (status, reply["error"]) == (400, "malformed_json"), (method, path, reply)
    # Unauthenticated too: the limit holds before anyone is known (was a 500).
    for path in ("/api/v1/tasks", "/api/v1/office/runtime/tasks", "/api/v1/agentctl/tasks"):
        status, _, reply = raw_request("POST", server.base + path, None, nested(1000))
        assert status in (400, 404) and status != 500, (path, reply)
    # Brackets inside strings nest nothing; the deepest allowed body still parses.
    inside = http(
        "POST", server.base + "/api/v1/tasks", server.token,
        {"workspace_id": ws, "title": "[" * 400, "description": '\\"{[' * 1000},
    )
    assert inside.status == 200, inside.body
    status, _, reply = raw_request(
        "PATCH", f"{server.base}/api/v1/tasks/{task_id}", server.token, nested(MAX_JSON_DEPTH - 1)
    )
    assert status == 422 or (status == 400 and reply["error"] != "malformed_json"), reply
    again = http("GET", f"{server.base}/api/v1/tasks/{inside.body['id']}", server.token)
    assert again.status == 200
    kept = http("GET", f"{server.base}/api/v1/tasks/{task_id}", server.token)
    assert kept.body["title"] == "kept" and kept.body["revision"] == made.body["revision"]


def test_cursors_outside_signed_64_bits_are_400_invalid_cursor_before_any_stream(server):
    ws = server.workspace_id
    for value in (TOO_BIG, "-1", "1e3", "\u0663", "99999999999999999999999999", "+1"):
        query = urllib.parse.quote(value)
        for path in (f"/api/v1/workspaces/{ws}/events", f"/api/v1/workspaces/{ws}/tasks"):
            url = f"{server.base}{path}?after={query}"
            status, _, reply = raw_request("GET", url, server.token)
            assert (status, reply["error"]) == (400, "invalid_cursor"), (path, value, reply)
        stream = f"{server.base}/api/v1/workspaces/{ws}/events/stream"
        status, headers, reply = raw_request("GET", f"{stream}?after={query}", server.token)
        assert (status, reply["error"]) == (400, "invalid_cursor"), (value, reply)
        assert headers["Content-Type"].startswith("application/json")
        if not value.isascii():
            continue  # a header carries only latin-1
        status, _, reply = raw_request("GET", stream, server.token, **{"Last-Event-ID": value})
        assert (status, reply["error"]) == (400, "invalid_cursor"), (value, reply)
    # The largest cursor is valid: an empty page, and a stream that starts and ends.
    status, _, page = raw_request(
        "GET", f"{server.base}/api/v1/workspaces/{ws}/events?after={MAX_CURSOR}", server.token
    )
    assert status == 200 and page["items"] == []
    request = urllib.request.Request(
        f"{server.base}/api/v1/workspaces/{ws}/events/stream?max_seconds=0.2",
        headers={"Authorization": f"Bearer {server.token}", "Last-Event-ID": str(MAX_CURSOR)},
    )
    with urllib.request.urlopen(request, timeout=20) as response:
        assert response.status == 200 and response.read().startswith(b"retry:")
    for limit in ("0", "1001", "1e400", "nan"):
        status, _, reply = raw_request(
            "GET", f"{server.base}/api/v1/workspaces/{ws}/events?limit={limit}", server.token
        )
        assert (status, reply["error"]) == (400, "invalid_cursor"), (limit, reply)
    status, _, reply = raw_request(
        "GET", f"{server.base}/api/v1/workspaces/{ws}/tasks?limit=99999999999999999999",
        server.token,
    )
    assert status == 422, reply


def test_policy_numbers_beyond_their_bounds_are_422_and_change_nothing(server):
    url = f"{server.base}/api/v1/workspaces/{server.workspace_id}/policy"
    assert http("PUT", url, server.token, {"wip_limit": 3}).body == {"wip_limit": 3}
    for value in (99999999999999999999, 100_001, 0, -1):
        reply = http("PUT", url, server.token, {"wip_limit": value})
        assert (reply.status, reply.body["error"]) == (422, "validation_failed"), value
    assert http("PUT", url, server.token, {"wip_limit": 100_000}).body == {"wip_limit": 100_000}


def test_invalid_utf8_in_a_lookup_query_is_400_malformed_query(server):
    ws = server.workspace_id
    made = http(
        "POST", server.base + "/api/v1/tasks", server.token,
        {"workspace_id": ws, "title": "t", "external_id": "\ufffd"},
    )
    assert made.status == 200, made.body
    lookup = f"{server.base}/api/v1/workspaces/{ws}/tasks/by-external-id?external_id=%FF"
    status, _, reply = raw_request("GET", lookup, server.token)
    # Not silently U+FFFD, which would find the task above.
    assert (status, reply["error"]) == (400, "malformed_query"), reply
    status, _, reply = raw_request("DELETE", lookup, server.token, **{"Idempotency-Key": "op-1"})
    assert (status, reply["error"]) == (400, "malformed_query"), reply
    for path in (f"/api/v1/workspaces/{ws}/tasks", f"/api/v1/workspaces/{ws}/identities/history"):
        status, _, reply = raw_request(
            "GET", f"{server.base}{path}?external_id=%C3%28", server.token
        )
        assert (status, reply["error"]) == (400, "malformed_query"), (path, reply)
    found = raw_request(
        "GET", f"{server.base}/api/v1/workspaces/{ws}/tasks/by-external-id?external_id=%EF%BF%BD",
        server.token,
    )
    assert found[0] == 200 and found[2]["id"] == made.body["id"]


def test_repositories_register_only_under_the_allowed_roots(settings, tmp_path):
    """A path outside KANDEV_REPOSITORY_ROOTS, or escaping them by a
    symlink or '..', is 422 repository_not_allowed and registers nothing."""
    from tests.integration.helpers import make_git_repository

    root = tmp_path / "roots"
    inside = make_git_repository(root / "inside")
    outside = make_git_repository(tmp_path / "outside")
    (root / "link").symlink_to(outside)
    served = ServedProcess(settings, tmp_path, KANDEV_REPOSITORY_ROOTS=f"/nonexistent:{root}")
    try:
        url = f"{served.base}/api/v1/workspaces/{served.workspace_id}/repositories"
        for name, path in (
            ("outside", outside),
            ("link", root / "link"),
            ("dotdot", root / ".." / "outside"),
        ):
            reply = http("POST", url, served.token, {"name": name, "path": str(path)})
            assert (reply.status, reply.body["error"]) == (422, "repository_not_allowed"), name
        made = http("POST", url, served.token, {"name": "inside", "path": str(inside)})
        assert made.status == 201, made.body
        listed = http("GET", url, served.token)
        assert [r["name"] for r in listed.body] == ["inside"]
    finally:
        served.stop()


def test_the_default_repository_root_is_the_data_dirs_repos(settings, tmp_path):
    from tests.integration.helpers import make_git_repository

    default = make_git_repository(settings.data_dir / "repos" / "app")
    elsewhere = make_git_repository(tmp_path / "elsewhere")
    served = ServedProcess(settings.with_overrides(repository_roots=()), tmp_path)
    try:
        url = f"{served.base}/api/v1/workspaces/{served.workspace_id}/repositories"
        reply = http("POST", url, served.token, {"name": "x", "path": str(elsewhere)})
        assert (reply.status, reply.body["error"]) == (422, "repository_not_allowed")
        assert http("POST", url, served.token, {"name": "app", "path": str(default)}).status == 201
    finally:
        served.stop()
