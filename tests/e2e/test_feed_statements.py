"""Ten open streams do not multiply the statements a server sends to the
database while the log moves (issue 48): the server's process has one feed
reader for all its streams (services/fanout.py). PostgreSQL only by nature:
the statements are counted on the wire, by a proxy between the streaming
server and PostgreSQL (``Q`` and ``E`` messages: every statement any part of
that server runs; it runs no background process, so they are its worker's).
Another served process, not proxied, makes the saves and runs the background
work, so the streams' server learns of them as of another node's.

Three phases on the same servers, each with the same 20 creates, one every
50 ms: no stream open, one, and ten (ten tokens). Every stream gets every
task.created once; the ten cost at most half again what the one costs above
the phase without streams (each stream reading and checking on its own cost
about ten times)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.parse
from collections import Counter
from http.client import HTTPConnection, HTTPException
from pathlib import Path

import pytest

from kandev_es.config import Settings
from tests.support.pg_proxy import PgProxy
from tests.support.served import ServedProcess, http

CREATES = 20
PAUSE_S = 0.05


class Follower:
    """A workspace's SSE stream, read on a thread of its own: the task ids of
    the task.created events it got, in order."""

    def __init__(self, server: ServedProcess, token: str, after: int) -> None:
        parts = urllib.parse.urlsplit(server.base)
        self._connection = HTTPConnection(parts.hostname, parts.port, timeout=60)
        self._connection.request(
            "GET",
            f"/api/v1/workspaces/{server.workspace_id}/events/stream?max_seconds=300&after={after}",
            headers={"Authorization": f"Bearer {token}"},
        )
        # The socket itself: a response read to the connection's close takes it
        # over (the connection's ``sock`` is None from then on), and only a
        # shutdown ends the reading thread's wait at once.
        self._socket = self._connection.sock
        self._response = self._connection.getresponse()
        assert self._response.status == 200, self._response.read()
        self.created: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        kind = ""
        with contextlib.suppress(OSError, HTTPException, ValueError):
            for raw in self._response:
                line = raw.decode()
                if line.startswith("event: "):
                    kind = line[7:].strip()
                elif line.startswith("data: ") and kind == "task.created":
                    subject = line.split('"subject": "', 1)[1].split('"', 1)[0]
                    self.created.append(subject)

    def close(self) -> None:
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_RDWR)
        self._thread.join(10)
        self._connection.close()


def _tokens(server: ServedProcess, count: int) -> list[str]:
    tokens = []
    for _ in range(count):
        issued = http("POST", server.base + "/api/v1/tokens", server.token,
                      {"workspace_id": server.workspace_id})
        assert issued.status == 201, issued.body
        tokens.append(issued.body["token"])
    return tokens


def _phase(streaming: ServedProcess, writer: ServedProcess, proxy: PgProxy,
           tokens: list[str], label: str) -> int:
    """Statements the streaming server sent while ``len(tokens)`` streams
    followed CREATES creates made on the other server."""
    after = _head(streaming)
    followers = [Follower(streaming, token, after) for token in tokens]
    try:
        time.sleep(1.0)  # each caught up and joined the reader
        before = proxy.statements()
        made = []
        for n in range(CREATES):
            answer = http("POST", writer.base + "/api/v1/tasks", writer_token(writer),
                          {"workspace_id": writer.workspace_id, "title": f"{label} {n}"})
            assert answer.status == 200, answer.body
            made.append(answer.body["id"])
            time.sleep(PAUSE_S)
        deadline = time.monotonic() + 30
        while any(len(f.created) < CREATES for f in followers):
            assert time.monotonic() < deadline, [len(f.created) for f in followers]
            time.sleep(0.05)
        time.sleep(0.2)
        spent = proxy.statements() - before
        for follower in followers:
            assert follower.created == made, "each once, in order"
    finally:
        for follower in followers:
            follower.close()
    return spent


def _head(server: ServedProcess) -> int:
    """The workspace feed's last position."""
    after = 0
    while True:
        page = http("GET", f"{server.base}/api/v1/workspaces/{server.workspace_id}/events"
                    f"?after={after}&limit=1000", server.token).body
        after = page["next_cursor"]
        if not page["has_more"]:
            return int(after)


def writer_token(writer: ServedProcess) -> str:
    return writer.admin_token  # type: ignore[attr-defined,no-any-return]


@pytest.mark.postgres_only
def test_ten_open_streams_cost_the_database_what_one_does(
    backend: str, settings: Settings, tmp_path: Path
) -> None:
    assert settings.database_url
    proxy, url = PgProxy.before(settings.database_url)
    streaming = writer = None
    try:
        # No background process beside the streaming server's worker (the
        # writer's runs the projection loop and the ledger): what is counted
        # is the worker's, streams and reader, not the background work's.
        streaming = ServedProcess(settings.with_overrides(database_url=url), tmp_path / "streams",
                                  workers=1, KANDEV_BACKGROUND="external")
        writer = ServedProcess(settings, tmp_path / "writer", workers=1)
        writer.admin_token = streaming.token  # type: ignore[attr-defined]
        writer.workspace_id = streaming.workspace_id
        tokens = _tokens(streaming, 10)
        spent = Counter[int]()
        for count in (0, 1, 10):
            spent[count] = _phase(streaming, writer, proxy, tokens[:count], f"phase {count}")
        print(f"statements while {CREATES} creates were followed: {dict(spent)}")
        one, ten = spent[1] - spent[0], spent[10] - spent[0]
        assert ten <= 1.5 * one + 20, dict(spent)
    finally:
        for server in (writer, streaming):
            if server is not None:
                server.stop()
        proxy.close()
