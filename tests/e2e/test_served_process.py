"""A real `kandev-es serve` process, spoken to over HTTP (stdlib urllib only).

Each test starts the console script as a subprocess on a free port with its
own data dir, reads the first-start lines it prints on stderr (admin token,
workspace id, the curl example), waits for /healthz, and stops the process
group at teardown (SIGTERM, then SIGKILL), also when the test fails. Every
wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kandev_es.config import Settings

WAIT_S = 20.0
HTTP_TIMEOUT_S = 10.0

# The lines src/kandev_es/server.py prints (first_start).
UUID_RE = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
CREATED_WS_RE = re.compile(rf"^kandev-es: created workspace default = ({UUID_RE})$", re.M)
TOKEN_RE = re.compile(r"^kandev-es: admin token \(shown once\): (kes_\S+)$", re.M)
KNOWN_WS_RE = re.compile(rf"^kandev-es: workspace default = ({UUID_RE});", re.M)
CURL_RE = re.compile(r"^\s*(curl -s -X POST \S+/api/v1/tasks .*)$", re.M)


# --------------------------------------------------------------------------
# HTTP


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str]


def http(
    method: str,
    url: str,
    *,
    token: str | None = None,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    sent = dict(headers or {})
    data = None
    if body is not None:
        data = json.dumps(body).encode("utf-8")
        sent.setdefault("Content-Type", "application/json")
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=data, method=method, headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            status, raw, got = response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        status, raw, got = error.code, error.read(), dict(error.headers)
    text = raw.decode("utf-8")
    try:
        parsed: Any = json.loads(text) if text else None
    except ValueError:
        parsed = text
    return Reply(status, parsed, got)


# --------------------------------------------------------------------------
# The served process


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def serve_command() -> list[str]:
    """The installed console script of this interpreter, else the same entry
    point through ``-c`` (``python -m kandev_es.cli`` is not an entry)."""
    script = Path(sys.executable).parent / "kandev-es"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-c", "from kandev_es.cli import main; main()"]


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    port: int
    stderr_path: Path
    stdout_path: Path
    workspace_id: str = ""
    token: str | None = None
    first_start: bool = False
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def logs(self) -> str:
        out = self.stdout_path.read_text(encoding="utf-8", errors="replace")
        return f"--- stderr\n{self.stderr()[-4000:]}\n--- stdout\n{out[-2000:]}"

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=WAIT_S)
        # Workers are in the same process group; make sure none outlives us.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)


class Launcher:
    def __init__(self, root: Path, settings: Settings) -> None:
        self._root = root
        self._settings = settings
        self._started: list[Server] = []

    def start(self) -> Server:
        index = len(self._started)
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("KANDEV_")}
        env["KANDEV_DATA_DIR"] = str(self._settings.data_dir)
        if self._settings.database_url:
            env["KANDEV_DATABASE_URL"] = self._settings.database_url
        env["PYTHONUNBUFFERED"] = "1"
        stderr_path = self._root / f"serve-{index}.stderr"
        stdout_path = self._root / f"serve-{index}.stdout"
        with stderr_path.open("wb") as err, stdout_path.open("wb") as out:
            process = subprocess.Popen(
                [*serve_command(), "serve", "--host", "127.0.0.1", "--port", str(port)],
                cwd=self._root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,  # its own process group, stopped as one
            )
        server = Server(process, port, stderr_path, stdout_path)
        self._started.append(server)
        self._await_banner(server)
        self._await_health(server)
        return server

    def stop_all(self) -> None:
        for server in reversed(self._started):
            server.stop()

    def _await_banner(self, server: Server) -> None:
        deadline = time.monotonic() + WAIT_S
        while True:
            text = server.stderr()
            created, token = CREATED_WS_RE.search(text), TOKEN_RE.search(text)
            if created and token and CURL_RE.search(text):
                server.workspace_id, server.token = created.group(1), token.group(1)
                server.first_start = True
                return
            known = KNOWN_WS_RE.search(text)
            if known:
                server.workspace_id = known.group(1)
                return
            if server.process.poll() is not None:
                pytest.fail(
                    f"kandev-es serve exited early ({server.process.returncode})\n" + server.logs()
                )
            if time.monotonic() > deadline:
                pytest.fail(f"no first-start lines within {WAIT_S}s\n" + server.logs())
            time.sleep(0.05)

    def _await_health(self, server: Server) -> None:
        deadline = time.monotonic() + WAIT_S
        while True:
            with contextlib.suppress(OSError):
                if http("GET", server.base + "/healthz").status == 200:
                    return
            if server.process.poll() is not None:
                pytest.fail(
                    f"kandev-es serve exited ({server.process.returncode})\n" + server.logs()
                )
            if time.monotonic() > deadline:
                pytest.fail(f"/healthz not ready within {WAIT_S}s\n" + server.logs())
            time.sleep(0.1)


@pytest.fixture
def embedded(tmp_path: Path) -> Settings:
    """The embedded default: SQLite under a fresh data dir."""
    return Settings(data_dir=tmp_path / "data")


@pytest.fixture
def launcher(tmp_path: Path, embedded: Settings) -> Iterator[Launcher]:
    launch = Launcher(tmp_path, embedded)
    try:
        yield launch
    finally:
        launch.stop_all()


@pytest.fixture
def any_backend_launcher(tmp_path: Path, settings: Settings) -> Iterator[Launcher]:
    """Like ``launcher``, on each backend of tests/conftest.py (SQLite, and
    PostgreSQL in a per-test schema that is dropped after the server stops)."""
    launch = Launcher(tmp_path, settings)
    try:
        yield launch
    finally:
        launch.stop_all()


def create(server: Server, token: str | None, **fields: Any) -> Reply:
    body = {"workspace_id": server.workspace_id, **fields}
    return http("POST", server.base + "/api/v1/tasks", token=token, body=body)


def lookup(server: Server, token: str | None, external_id: str) -> Reply:
    query = urllib.parse.urlencode({"external_id": external_id})
    url = f"{server.base}/api/v1/workspaces/{server.workspace_id}/tasks/by-external-id?{query}"
    return http("GET", url, token=token)


# --------------------------------------------------------------------------
# Tests


def test_first_start_prints_a_working_admin_token_and_curl_line(launcher: Launcher) -> None:
    server = launcher.start()
    assert server.first_start
    assert server.token is not None
    uuid.UUID(server.workspace_id)

    workspace = http(
        "GET", f"{server.base}/api/v1/workspaces/{server.workspace_id}", token=server.token
    )
    assert workspace.status == 200, workspace.body
    assert workspace.body["name"] == "default"

    # The printed curl line is a working request: replay it without curl.
    match = CURL_RE.search(server.stderr())
    assert match is not None
    words = shlex.split(match.group(1))
    url = words[words.index("-X") + 2]
    assert url == f"{server.base}/api/v1/tasks"
    headers = dict(words[i + 1].split(": ", 1) for i, word in enumerate(words) if word == "-H")
    assert headers["Authorization"] == f"Bearer {server.token}"
    payload = json.loads(words[words.index("-d") + 1])
    assert payload["workspace_id"] == server.workspace_id
    reply = http("POST", url, body=payload, headers=headers)
    assert reply.status == 200, reply.body
    assert reply.body["outcome"] == "created"
    assert reply.body["external_id"] == payload["external_id"]


def test_created_then_found_settled_over_http(any_backend_launcher: Launcher) -> None:
    server = any_backend_launcher.start()
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


def test_second_start_keeps_tasks_and_prints_no_new_token(any_backend_launcher: Launcher) -> None:
    first = any_backend_launcher.start()
    assert first.first_start and first.token is not None
    token = first.token
    created = create(first, token, external_id="JIRA-7", title="Survives a restart")
    assert created.status == 200, created.body
    assert created.body["outcome"] == "created"
    first.stop()
    assert first.process.returncode is not None

    second = any_backend_launcher.start()
    assert not second.first_start
    assert "admin token" not in second.stderr()
    assert second.workspace_id == first.workspace_id

    found = lookup(second, token, "JIRA-7")
    assert found.status == 200, found.body
    assert found.body["id"] == created.body["id"]
    retry = create(second, token, external_id="JIRA-7", title="Survives a restart")
    assert retry.status == 200, retry.body
    assert retry.body["outcome"] == "found_settled"
    assert retry.body["id"] == created.body["id"]


def test_another_workspaces_token_gets_task_not_created(launcher: Launcher) -> None:
    server = launcher.start()
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
        assert denied.body == {"error": "task not created"}

    assert create(server, "kes_not-a-real-token", external_id="JIRA-1", title="x").body == {
        "error": "task not created"
    }

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
