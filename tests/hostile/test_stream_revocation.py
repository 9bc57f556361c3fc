"""An open event stream answers to its token and workspace for its whole life,
not only when it opens: once the token is revoked or the workspace deleted, the
stream says why in a last comment and ends within one heartbeat, and nothing
that happened after the revocation reaches it. On `kandev-es serve`, both
backends. (A run credential never opens a stream: test_run_credentials.py.)"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.parse
from http.client import HTTPConnection, HTTPException, HTTPResponse

import pytest

from kandev_es.services.feeds import HEARTBEAT_SECONDS
from tests.support.served import ServedProcess, http, run_cli

# One heartbeat, plus room for a poll, the check's reads and a loaded machine.
ENDS_WITHIN_S = HEARTBEAT_SECONDS + 5.0
LIVE_WITHIN_S = 30.0  # a create reaching the feed through the projection


class StreamReader:
    """A workspace's SSE stream read line by line on a thread of its own."""

    def __init__(self, server: ServedProcess, token: str, workspace_id: str) -> None:
        parts = urllib.parse.urlsplit(server.base)
        self._connection = HTTPConnection(parts.hostname, parts.port, timeout=30)
        self._connection.request(
            "GET",
            f"/api/v1/workspaces/{workspace_id}/events/stream?max_seconds=120",
            headers={"Authorization": f"Bearer {token}"},
        )
        response: HTTPResponse = self._connection.getresponse()
        assert response.status == 200, (response.status, response.read())
        self._response = response
        self.lines: list[str] = []
        self.ended = threading.Event()
        self.ended_at = 0.0
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for raw in self._response:
                self.lines.append(raw.decode("utf-8").rstrip("\n"))
        except (OSError, HTTPException):
            pass  # closed by close(): the lines so far are what it read
        finally:
            self.ended_at = time.monotonic()
            self.ended.set()

    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, needle: str, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while needle not in self.text():
            assert not self.ended.is_set(), f"stream ended early:\n{self.text()}"
            assert time.monotonic() < deadline, f"{needle!r} never came:\n{self.text()}"
            time.sleep(0.05)

    def close(self) -> None:
        if self._connection.sock is not None:
            with contextlib.suppress(OSError):
                self._connection.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(10)
        self._connection.close()


@pytest.fixture
def server(settings, tmp_path):
    served = ServedProcess(settings, tmp_path, workers=1)
    yield served
    served.stop()


def _member(server: ServedProcess, label: str) -> tuple[str, str]:
    """A member token of the default workspace: (secret, id)."""
    issued = http(
        "POST", server.base + "/api/v1/tokens", server.token,
        {"workspace_id": server.workspace_id, "label": label},
    )
    assert issued.status == 201, issued.body
    listed = http("GET", server.base + "/api/v1/tokens", server.token).body["tokens"]
    [token_id] = [row["id"] for row in listed if row["label"] == label]
    return issued.body["token"], token_id


def _create(server: ServedProcess, workspace_id: str, external_id: str) -> None:
    made = http(
        "POST", server.base + "/api/v1/tasks", server.token,
        {"workspace_id": workspace_id, "external_id": external_id, "title": external_id,
         "start_agent": False},
    )
    assert made.status == 200, made.body


def test_a_revoked_tokens_open_stream_ends_within_a_heartbeat_and_gets_nothing_after(server):
    secret, token_id = _member(server, "stream-reader")
    stream = StreamReader(server, secret, server.workspace_id)
    try:
        _create(server, server.workspace_id, "BEFORE-REVOKE")
        stream.wait_for('"external_id": "BEFORE-REVOKE"', LIVE_WITHIN_S)

        revoked = http("DELETE", f"{server.base}/api/v1/tokens/{token_id}", server.token)
        revoked_at = time.monotonic()
        assert revoked.status == 204, revoked.body
        _create(server, server.workspace_id, "AFTER-REVOKE")

        assert stream.ended.wait(ENDS_WITHIN_S + 1.0), f"still open:\n{stream.text()}"
        took = stream.ended_at - revoked_at
    finally:
        stream.close()
    assert took < ENDS_WITHIN_S, took
    assert ": stream closed: token revoked" in stream.lines
    assert "AFTER-REVOKE" not in stream.text()
    assert stream.lines[-2:] == [": stream closed: token revoked", ""]
    # The token opens no new stream either.
    again = http(
        "GET", f"{server.base}/api/v1/workspaces/{server.workspace_id}/events/stream", secret,
    )
    assert again.status == 404


def test_an_idle_stream_ends_within_a_heartbeat_of_a_cli_revocation(settings, server):
    secret, token_id = _member(server, "idle-reader")
    stream = StreamReader(server, secret, server.workspace_id)
    try:
        time.sleep(0.5)  # the stream is in its idle poll, no event will wake it
        revoked = run_cli(settings, "token", "revoke", token_id)  # another process
        revoked_at = time.monotonic()
        assert revoked.returncode == 0, revoked.stderr
        assert stream.ended.wait(ENDS_WITHIN_S + 1.0), f"still open:\n{stream.text()}"
        took = stream.ended_at - revoked_at
    finally:
        stream.close()
    assert took < ENDS_WITHIN_S, took
    assert ": stream closed: token revoked" in stream.lines


def test_a_deleted_workspaces_open_stream_ends_within_a_heartbeat(server):
    made = http("POST", server.base + "/api/v1/workspaces", server.token, {"name": "doomed"})
    assert made.status in (200, 201), made.body
    doomed = made.body["id"]
    issued = http(
        "POST", server.base + "/api/v1/tokens", server.token, {"workspace_id": doomed},
    )
    assert issued.status == 201, issued.body
    stream = StreamReader(server, issued.body["token"], doomed)
    # A stream on another workspace, by the same admin, is untouched by the deletion.
    bystander = StreamReader(server, server.token, server.workspace_id)
    try:
        _create(server, doomed, "IN-DOOMED")
        stream.wait_for('"external_id": "IN-DOOMED"', LIVE_WITHIN_S)

        deleted = http("DELETE", f"{server.base}/api/v1/workspaces/{doomed}", server.token)
        deleted_at = time.monotonic()
        assert deleted.status == 200, deleted.body

        assert stream.ended.wait(ENDS_WITHIN_S + 1.0), f"still open:\n{stream.text()}"
        took = stream.ended_at - deleted_at
        _create(server, server.workspace_id, "ELSEWHERE")
        bystander.wait_for('"external_id": "ELSEWHERE"', LIVE_WITHIN_S)
    finally:
        stream.close()
        bystander.close()
    assert took < ENDS_WITHIN_S, took
    assert ": stream closed: workspace deleted" in stream.lines
