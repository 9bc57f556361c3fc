"""A real `kandev-es serve` process, spoken to over HTTP (stdlib urllib only).

Each test starts the console script with tests/support/served.py (a free port,
its own data dir, the first-start lines it prints, /healthz), and every process
it started is stopped at teardown, also when the test fails.
"""

from __future__ import annotations

import re
import shlex
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kandev_es.config import Settings
from kandev_es.errors import NOT_VALID_FOR_WORKSPACE
from tests.support.errors import without_request_id
from tests.support.served import Reply, ServedProcess, http

NOT_CREATED = {"error": "task not created", "message": NOT_VALID_FOR_WORKSPACE}
# The curl line src/kandev_es/server.py prints on a first start.
CURL_RE = re.compile(r"^\s*(curl -s \S+/api/v1/workspaces/\S+/tasks .*)$", re.M)

Start = Callable[[], ServedProcess]


def _starter(settings: Settings, log_dir: Path) -> Iterator[Start]:
    started: list[ServedProcess] = []

    def start() -> ServedProcess:
        started.append(ServedProcess(settings, log_dir))
        return started[-1]

    try:
        yield start
    finally:
        for server in reversed(started):
            server.stop()


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Start]:
    """Starts `kandev-es serve` on the embedded default (SQLite, a fresh data dir)."""
    yield from _starter(Settings(data_dir=tmp_path / "data"), tmp_path)


@pytest.fixture
def launch_any_backend(tmp_path: Path, settings: Settings) -> Iterator[Start]:
    """Like ``launch``, on each backend of tests/conftest.py (SQLite, and
    PostgreSQL in a per-test schema that is dropped after the server stops)."""
    yield from _starter(settings, tmp_path)


def create(server: ServedProcess, token: str | None, **fields: Any) -> Reply:
    body = {"workspace_id": server.workspace_id, **fields}
    return http("POST", server.base + "/api/v1/tasks", token=token, body=body)


def lookup(server: ServedProcess, token: str | None, external_id: str) -> Reply:
    query = urllib.parse.urlencode({"external_id": external_id})
    url = f"{server.base}/api/v1/workspaces/{server.workspace_id}/tasks/by-external-id?{query}"
    return http("GET", url, token=token)


# --------------------------------------------------------------------------
# Tests


def test_first_start_prints_a_working_admin_token_and_curl_line(launch: Start) -> None:
    server = launch()
    assert server.first_start
    assert server.token is not None
    uuid.UUID(server.workspace_id)

    workspace = http(
        "GET", f"{server.base}/api/v1/workspaces/{server.workspace_id}", token=server.token
    )
    assert workspace.status == 200, workspace.body
    assert workspace.body["name"] == "default"

    # The printed curl line is a working request that creates nothing (the
    # tours' first create must answer `created`): replay it without curl.
    match = CURL_RE.search(server.output())
    assert match is not None
    words = shlex.split(match.group(1))
    url = words[2]
    assert url == f"{server.base}/api/v1/workspaces/{server.workspace_id}/tasks"
    assert "-X" not in words and "-d" not in words
    headers = dict(words[i + 1].split(": ", 1) for i, word in enumerate(words) if word == "-H")
    assert headers["Authorization"] == f"Bearer {server.token}"
    reply = http("GET", url, headers=headers)
    assert reply.status == 200, reply.body
    assert reply.body == {"has_more": False, "items": [], "next_cursor": None}


def test_created_then_found_settled_over_http(launch_any_backend: Start) -> None:
    server = launch_any_backend()
    token = server.token

    first = create(server, token, external_id="JIRA-1", title="First task")
    assert first.status == 200, first.body
    assert (first.body["outcome"], first.body["deduplicated"], first.body["creation_complete"]) == (
        "created",
        False,
        True,
    )
    task_id = first.body["id"]

    retry = create(server, token, external_id="JIRA-1", title="First task")
    assert retry.status == 200, retry.body
    assert (retry.body["outcome"], retry.body["deduplicated"], retry.body["creation_complete"]) == (
        "found_settled",
        True,
        True,
    )
    assert retry.body["id"] == task_id

    # A held identity answers Found before the rest of the body is validated,
    # and the existing task is returned unchanged (not patched).
    drifted = create(
        server, token, external_id="\u00a0JIRA-1 ", title="", workflow="no-such-workflow"
    )
    assert drifted.status == 200, drifted.body
    assert drifted.body["outcome"] == "found_settled"
    assert drifted.body["id"] == task_id
    assert drifted.body["title"] == "First task"
    assert drifted.body["revision"] == first.body["revision"]

    found = lookup(server, token, "JIRA-1")
    assert found.status == 200, found.body
    assert found.body["id"] == task_id
    assert found.body["creation_complete"] is True

    # Byte-exact, case-sensitive: another spelling is another identity.
    assert lookup(server, token, "jira-1").status == 404


def test_second_start_keeps_tasks_and_prints_no_new_token(launch_any_backend: Start) -> None:
    first = launch_any_backend()
    assert first.first_start and first.token is not None
    token = first.token
    created = create(first, token, external_id="JIRA-7", title="Survives a restart")
    assert created.status == 200, created.body
    assert created.body["outcome"] == "created"
    first.stop()
    assert first.process.returncode is not None

    second = launch_any_backend()
    assert not second.first_start
    assert "admin token" not in second.output()
    assert second.workspace_id == first.workspace_id

    found = lookup(second, token, "JIRA-7")
    assert found.status == 200, found.body
    assert found.body["id"] == created.body["id"]
    retry = create(second, token, external_id="JIRA-7", title="Survives a restart")
    assert retry.status == 200, retry.body
    assert retry.body["outcome"] == "found_settled"
    assert retry.body["id"] == created.body["id"]


def test_another_workspaces_token_gets_task_not_created(launch: Start) -> None:
    server = launch()
    admin = server.token
    held = create(server, admin, external_id="JIRA-1", title="Held")
    assert held.status == 200, held.body

    other = http(
        "POST",
        server.base + "/api/v1/workspaces",
        token=admin,
        body={"name": "other", "task_prefix": "OTH"},
    )
    assert other.status == 201, other.body
    issued = http(
        "POST",
        server.base + "/api/v1/tokens",
        token=admin,
        body={"workspace_id": other.body["id"], "label": "e2e"},
    )
    assert issued.status == 201, issued.body
    foreign = issued.body["token"]

    # Same answer whether the identity is held or not, and whatever the body
    # says: authorization comes before any validation.
    for fields in (
        {"external_id": "JIRA-1", "title": "Held"},
        {"external_id": "JIRA-404", "title": "Not held"},
        {"external_id": "bad\u0001id", "title": ""},
    ):
        denied = create(server, foreign, **fields)
        assert denied.status == 404, denied.body
        assert without_request_id(denied.body) == NOT_CREATED

    refused = create(server, "kes_not-a-real-token", external_id="JIRA-1", title="x")
    assert without_request_id(refused.body) == NOT_CREATED

    # The foreign token works in its own workspace; the identity is per workspace.
    own = http(
        "POST",
        server.base + "/api/v1/tasks",
        token=foreign,
        body={"external_id": "JIRA-1", "title": "Same key, other workspace"},
    )
    assert own.status == 200, own.body
    assert own.body["outcome"] == "created"
    assert own.body["workspace_id"] == other.body["id"]
    assert own.body["id"] != held.body["id"]
