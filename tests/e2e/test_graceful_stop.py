"""A stopped server finishes what it started (docs/operations.md: Stopping):
on SIGTERM it accepts nothing more, ends open event streams at once with a last
comment (their clients reconnect elsewhere), lets answers already being sent
reach a slow reader whole, and exits before gunicorn's graceful timeout (10 s)
would SIGKILL a worker. Real served processes: `kandev-es serve` (SQLite) and
the production command (PostgreSQL, 2 workers)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from kandev_es.config import Settings
from tests.support.served import ConfServed, ServedProcess, http, open_event_stream

TASKS = 80
DESCRIPTION = "d" * 99_000  # the list answer is ~8 MB: more than the kernel buffers hold
GRACEFUL_S = 10.0


def slow_list_reader(server: ServedProcess) -> tuple[socket.socket, bytes]:
    """A connection that asked for the task list with a small receive buffer
    and read only the start of the answer: the rest waits in the server."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    sock.settimeout(20)
    sock.connect(("127.0.0.1", server.port))
    sock.sendall(
        f"GET /api/v1/workspaces/{server.workspace_id}/tasks?limit=500 HTTP/1.1\r\n"
        f"Host: x\r\nAuthorization: Bearer {server.token}\r\n\r\n".encode()
    )
    return sock, sock.recv(4096)


def read_answer(sock: socket.socket, start: bytes) -> tuple[int, int, bytes]:
    """The rest of the answer begun with ``start``: its status, its
    Content-Length and the body that came before the server closed."""
    data = start
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(
        line.split(b":", 1)[1] for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    ))
    while len(body) < length:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        body += chunk
    return int(head.split()[1]), length, body


@pytest.mark.parametrize(
    ("backend", "command"), [("sqlite", "serve"), ("postgres", "gunicorn.conf")],
    indirect=["backend"],
)
def test_sigterm_ends_streams_at_once_delivers_answers_and_exits_before_sigkill(
    command: str, settings: Settings, tmp_path: Path
) -> None:
    server = (ServedProcess if command == "serve" else ConfServed)(settings, tmp_path)
    reader = None
    try:
        for n in range(TASKS):
            body = {"workspace_id": server.workspace_id, "title": f"big {n}",
                    "description": DESCRIPTION}
            created = http("POST", server.base + "/api/v1/tasks", server.token, body)
            assert created.status == 200, created.body
        stream, status, _ = open_event_stream(server, server.token)
        assert status == 200
        reader, start = slow_list_reader(server)
        time.sleep(0.5)  # the list is answered: its bytes wait in the server's buffers
        stopped_at = time.monotonic()
        os.kill(server.process.pid, signal.SIGTERM)  # the master, as an operator would
        assert stream.stream_response is not None
        tail = stream.stream_response.read()  # until the server ends the stream
        ended_s = time.monotonic() - stopped_at
        assert b": stream closed: server stopping" in tail, tail[-200:]
        assert ended_s < 3.0, ended_s
        status, length, listed = read_answer(reader, start)
        print(f"{command}: answer of {len(listed)} bytes read {time.monotonic() - stopped_at:.2f} s"
              " after SIGTERM")
        assert status == 200
        assert len(listed) == length > 4_000_000, "the answer reached the reader whole"
        assert json.loads(listed)["items"]
        server.process.wait(timeout=GRACEFUL_S + 5)
        exited_s = time.monotonic() - stopped_at
        log = server.output()
        print(f"{command}: stream ended {ended_s:.2f} s, exit {exited_s:.2f} s after SIGTERM")
        assert "SIGKILL" not in log and "WORKER TIMEOUT" not in log, log[-3000:]
        assert exited_s < GRACEFUL_S, exited_s
        with contextlib.suppress(OSError), socket.create_connection(
            ("127.0.0.1", server.port), timeout=1
        ):
            raise AssertionError("still accepting after SIGTERM")
    finally:
        if reader is not None:
            reader.close()
        server.stop()
