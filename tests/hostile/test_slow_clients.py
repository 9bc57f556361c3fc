"""Slow and idle clients cannot take the server: a request reaches a worker
thread only once it has fully arrived, within bounded header and body times
(docs/security.md: Input limits and streams). Over real served processes,
`kandev-es serve` and the production command of docs/operations.md (gunicorn with
http/gunicorn.conf.py); the latency bounds are behaviour bounds with wide
margins on a shared machine, not a benchmark. A chunked body is held to the
same limits as one with a Content-Length."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import uuid
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import pytest

from kandev_es.config import Settings
from tests.support.served import (
    ROOT,
    ConfServed,
    Reply,
    ServedProcess,
    environment,
    free_port,
    http,
    kandev_command,
    open_event_stream,
)
from tests.support.slow_clients import Loiterers, connect, wait_closed

DRIP = 256
SILENT = 256
STREAMS_PER_TOKEN = 8
TOKENS = 4
SAMPLE_S = 10.0


def issue_tokens(server: ServedProcess, count: int) -> list[str]:
    tokens = []
    for _ in range(count):
        issued = http(
            "POST", server.base + "/api/v1/tokens", server.token,
            {"workspace_id": server.workspace_id},
        )
        assert issued.status in (200, 201), issued.body
        tokens.append(issued.body["token"])
    return tokens


def timed_http(*args: Any, **kwargs: Any) -> tuple[float, Reply]:
    """One request (tests.support.served.http) and the seconds it took."""
    started = time.monotonic()
    reply = http(*args, timeout=5, **kwargs)
    return time.monotonic() - started, reply


def task_exists(server: ServedProcess, external_id: str) -> bool:
    found = http(
        "GET",
        f"{server.base}/api/v1/workspaces/{server.workspace_id}/tasks/by-external-id"
        f"?external_id={external_id}",
        server.token,
    )
    assert found.status in (200, 404), found.body
    return found.status == 200


def create_body(server: ServedProcess, external_id: str, description: str = "d") -> bytes:
    return json.dumps(
        {
            "workspace_id": server.workspace_id,
            "external_id": external_id,
            "title": "sent in chunks",
            "description": description,
        }
    ).encode()


def send_chunked(server: ServedProcess, chunks: list[bytes], raw_tail: bytes = b"") -> tuple[
    int, dict[str, object]
]:
    """POST /api/v1/tasks with Transfer-Encoding: chunked, each of ``chunks``
    framed as one chunk, then the last chunk, or ``raw_tail`` instead when given
    (framing of the caller's own). The status and the JSON reply."""
    connection = HTTPConnection("127.0.0.1", server.port, timeout=20)
    try:
        connection.putrequest("POST", "/api/v1/tasks")
        connection.putheader("Authorization", f"Bearer {server.token}")
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Transfer-Encoding", "chunked")
        connection.endheaders()
        for chunk in chunks:
            connection.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        connection.send(raw_tail or b"0\r\n\r\n")
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def launch(kind: str, settings: Settings, log_dir: Path, **env: str) -> ServedProcess:
    if kind == "serve":
        return ServedProcess(settings, log_dir, **env)
    return ConfServed(settings, log_dir, **env)


@pytest.mark.parametrize(
    ("backend", "command"),
    [("sqlite", "serve"), ("postgres", "gunicorn.conf")],
    indirect=["backend"],
)
def test_dripping_silent_and_streaming_clients_leave_healthz_and_creates_answering(
    command: str, settings: Settings, tmp_path: Path
) -> None:
    """256 connections dripping headers a byte a second, 256 connected and
    silent (both reopened whenever the server closes them) and 32 open event
    streams, all at once: /healthz answers in under 1 s and a create in under
    2 s, sampled for 10 s. Default timeouts: the server does close the idle ones
    meanwhile (after 5 s), and the attacker opens them again."""
    server = launch(command, settings, tmp_path)
    streams: list[HTTPConnection] = []
    try:
        tokens = issue_tokens(server, TOKENS)
        with Loiterers(server.port, drip=DRIP, silent=SILENT) as loiterers:
            for token in tokens:
                for _ in range(STREAMS_PER_TOKEN):
                    stream, status, _ = open_event_stream(server, token)
                    streams.append(stream)
                    assert status == 200, server.log()
            healthz: list[float] = []
            creates: list[float] = []
            started = time.monotonic()
            while time.monotonic() - started < SAMPLE_S:
                took, reply = timed_http("GET", server.base + "/healthz")
                assert reply.status == 200
                healthz.append(took)
                body = {
                    "workspace_id": server.workspace_id,
                    "external_id": f"SLOW-{len(creates)}",
                    "title": "t",
                }
                took, reply = timed_http("POST", server.base + "/api/v1/tasks", server.token, body)
                assert reply.status == 200, reply.body
                creates.append(took)
                time.sleep(0.3)
            held = loiterers.open_count()
            reopened = loiterers.reopened
        print(f"{command}: healthz max {max(healthz):.3f} s, create max {max(creates):.3f} s, "
              f"{len(healthz)} samples, {reopened} reopened")
        assert held == DRIP + SILENT
        assert max(healthz) < 1.0, sorted(healthz)[-5:]
        assert max(creates) < 2.0, sorted(creates)[-5:]
        assert len(healthz) >= 5, "sampled throughout"
        assert reopened >= SILENT, "the idle connections were closed by the server meanwhile"
    finally:
        for stream in streams:
            with contextlib.suppress(OSError):
                stream.close()
        server.stop()


SHORT = {"KANDEV_HEADER_TIMEOUT": "2", "KANDEV_BODY_TIMEOUT": "3", "KANDEV_IDLE_TIMEOUT": "1"}
# Maintenance runs once a second: a close comes at most ~1.5 s after its time.
LATE_S = 3.0


@pytest.fixture
def short_timeouts(settings: Settings, tmp_path: Path):  # type: ignore[no-untyped-def]
    served = ServedProcess(settings, tmp_path, **SHORT)
    yield served
    served.stop()


def drip(sock: socket.socket, data: bytes, every_s: float, seconds: float) -> float | None:
    """Send ``data`` a byte every ``every_s`` until the server closes ``sock``:
    seconds until it did, or None if it was still open after ``seconds``."""
    started = time.monotonic()
    for byte in (data * 1000)[: int(seconds / every_s)]:
        try:
            sock.send(bytes([byte]))
        except OSError:
            return time.monotonic() - started
        closed = wait_closed(sock, every_s)
        if closed is not None:
            return time.monotonic() - started
    return None


def test_a_connection_dripping_headers_is_closed_after_the_header_timeout(short_timeouts):
    """Headers a byte every 0.3 s (never idle, never complete): closed once
    KANDEV_HEADER_TIMEOUT (2 s) has passed since the first byte."""
    sock = connect(short_timeouts.port)
    try:
        took = drip(sock, b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 100, 0.3, 20)
    finally:
        sock.close()
    assert took is not None, "a dripping connection was never closed"
    assert 2.0 <= took <= 2.0 + LATE_S, took


def test_a_body_dripping_after_its_headers_is_closed_after_the_body_timeout(short_timeouts):
    """Complete headers announcing 1000 bytes, then a byte every 0.3 s: closed
    once KANDEV_BODY_TIMEOUT (3 s) has passed since the request's first byte,
    and nothing of it reached the application."""
    body = create_body(short_timeouts, "DRIP-BODY")
    head = (
        f"POST /api/v1/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {short_timeouts.token}"
        f"\r\nContent-Type: application/json\r\nContent-Length: {len(body) + 1000}\r\n\r\n"
    ).encode()
    sock = connect(short_timeouts.port)
    try:
        sock.setblocking(True)
        sock.sendall(head)
        sock.setblocking(False)
        took = drip(sock, body, 0.3, 20)
    finally:
        sock.close()
    assert took is not None, "a dripping body was never closed"
    assert 3.0 - 0.5 <= took <= 3.0 + LATE_S, took
    assert not task_exists(short_timeouts, "DRIP-BODY")


def test_a_silent_connection_is_closed_after_the_idle_timeout_and_a_stream_is_not(
    short_timeouts,
):
    """A connection that sends nothing is closed after KANDEV_IDLE_TIMEOUT (1 s);
    so is a kept-alive one after its answer. An event stream being served stays
    open past every timeout."""
    server = short_timeouts
    silent = connect(server.port)
    kept = HTTPConnection("127.0.0.1", server.port, timeout=10)
    stream = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        stream.sendall(
            f"GET /api/v1/workspaces/{server.workspace_id}/events/stream?max_seconds=60 HTTP/1.1"
            f"\r\nHost: x\r\nAuthorization: Bearer {server.token}\r\n\r\n".encode()
        )
        first = stream.recv(65536)
        assert first.startswith(b"HTTP/1.1 200"), first
        kept.request("GET", "/healthz")
        assert kept.getresponse().read()
        took = wait_closed(silent, 10)
        assert took is not None and took <= 1.0 + LATE_S, took
        assert kept.sock is not None
        kept.sock.setblocking(False)
        assert wait_closed(kept.sock, 1.0 + LATE_S) is not None, "kept-alive idle not closed"
        stream.setblocking(False)
        assert wait_closed(stream, 6.0) is None, "the stream was cut"
    finally:
        silent.close()
        kept.close()
        stream.close()


def test_a_malformed_chunked_body_is_400_and_stores_nothing(server_small_body):
    server = server_small_body
    external_id = f"CHUNK-{uuid.uuid4().hex[:8]}"
    body = create_body(server, external_id)
    status, reply = send_chunked(server, [body[:20]], raw_tail=b"zz\r\n" + body[20:] + b"\r\n")
    assert (status, reply["error"]) == (400, "bad_request"), reply
    assert not task_exists(server, external_id)
    # The same body, well framed, is a create: chunked bodies do reach the API.
    status, reply = send_chunked(server, [body[:20], body[20:]])
    assert status == 200, reply
    assert task_exists(server, external_id)


MAX_BODY = 4096


@pytest.fixture
def server_small_body(settings: Settings, tmp_path: Path):  # type: ignore[no-untyped-def]
    served = ServedProcess(settings, tmp_path, KANDEV_MAX_BODY_BYTES=str(MAX_BODY))
    yield served
    served.stop()


def test_a_chunked_body_over_the_limit_is_413_and_nothing_of_it_is_processed(server_small_body):
    """A valid create over KANDEV_MAX_BODY_BYTES, sent in chunks, is refused
    whole (it was cut to the limit and processed before); so is the same body
    with a Content-Length."""
    server = server_small_body
    body = create_body(server, "CHUNK-BIG", description="x" * (MAX_BODY + 100))
    status, reply = send_chunked(server, [body[i : i + 1000] for i in range(0, len(body), 1000)])
    assert (status, reply["error"]) == (413, "payload_too_large"), reply
    reply2 = http("POST", server.base + "/api/v1/tasks", server.token, raw=body,
                  headers={"Content-Type": "application/json"})
    assert (reply2.status, reply2.body["error"]) == (413, "payload_too_large"), reply2.body
    # Refused by the HTTP front, before the app: still an answer with its id.
    assert reply2.body["request_id"] == reply2.headers["X-Request-Id"], reply2
    assert not task_exists(server, "CHUNK-BIG")


@pytest.mark.parametrize(
    "name", ["KANDEV_HEADER_TIMEOUT", "KANDEV_BODY_TIMEOUT", "KANDEV_IDLE_TIMEOUT"]
)
def test_an_unusable_timeout_stops_both_commands_with_one_line(name: str, tmp_path: Path) -> None:
    """`kandev-es serve` and the production command refuse a timeout that is not
    finite positive seconds: exit 2, one line naming the setting, nothing served."""
    env = environment(Settings(data_dir=tmp_path / "data"), **{name: "nan"})
    commands = [
        [*kandev_command(), "serve", "--port", str(free_port())],
        [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "http" / "gunicorn.conf.py"),
         "--bind", f"127.0.0.1:{free_port()}", "kandev_es.api:create_app()"],
    ]
    for command in commands:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=60,
            stdin=subprocess.DEVNULL, check=False,
        )
        assert done.returncode == 2, (command, done.stderr)
        assert done.stderr.strip().count("\n") == 0 and name in done.stderr, done.stderr
