"""`kandev-es mcp --http`'s own refusals are answers like any other (issue 46
point 1, as tests/hostile/test_front_refusals.py holds for `serve`): a 2 MB
body (413, declared or chunked), a 5,000-character URL (414), oversized
headers (431, ours and h11's whole-head bound), a malformed request line
(400), and headers or a body that stop coming (408) each keep the caller's
well-formed X-Request-Id, write an access line with it and count in the
server's /metrics under their status, in the API's JSON error shape. Before,
uvicorn answered 400 in plain text with no id, line or count, let a long URL
through, and held a connection whose headers never ended for ever. Over a
real served process, raw sockets, both backends."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from collections.abc import Iterator

import pytest

from tests.hostile.test_front_refusals import exchange
from tests.support.mcp_client import server_env
from tests.support.served import ServedMcp

HEADER_TIMEOUT_S = 2
BODY_TIMEOUT_S = 2


@pytest.fixture
def served(settings, services, tmp_path) -> Iterator[ServedMcp]:
    env = server_env(settings)
    env.update(
        KANDEV_HEADER_TIMEOUT=str(HEADER_TIMEOUT_S),
        KANDEV_BODY_TIMEOUT=str(BODY_TIMEOUT_S),
        KANDEV_LOG_FORMAT="json",
    )
    with ServedMcp(settings, tmp_path, **env) as server:
        yield server


def refusals() -> dict[str, tuple[int, str, bytes]]:
    """Each refusal: (status, error code, the request with {id} where its id goes)."""
    return {
        "413": (
            413,
            "payload_too_large",
            b"POST /mcp HTTP/1.1\r\nHost: x\r\nX-Request-Id: {id}\r\n"
            b"Content-Type: application/json\r\nContent-Length: 2000000\r\n\r\n" + b"x" * 2_000_000,
        ),
        "413-chunked": (
            413,
            "payload_too_large",
            b"POST /mcp HTTP/1.1\r\nHost: x\r\nX-Request-Id: {id}\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"".join(b"10000\r\n" + b"x" * 0x10000 + b"\r\n" for _ in range(20))
            + b"0\r\n\r\n",
        ),
        "414": (
            414,
            "request_line_too_long",
            b"GET /mcp?q=" + b"q" * 5000 + b" HTTP/1.1\r\nHost: x\r\nX-Request-Id: {id}\r\n\r\n",
        ),
        # The id comes after 200 KB of head the front refused at its first 4 KB.
        "414-late-id": (
            414,
            "request_line_too_long",
            b"GET /mcp?q="
            + b"q" * 200_000
            + b" HTTP/1.1\r\nHost: x\r\n"
            + b"".join(b"X-H%d: v\r\n" % n for n in range(50))
            + b"X-Request-Id: {id}\r\n\r\n",
        ),
        "431": (
            431,
            "header_fields_too_large",
            b"GET /mcp HTTP/1.1\r\nHost: x\r\nX-Request-Id: {id}\r\nX-Big: "
            + b"b" * 20_000
            + b"\r\n\r\n",
        ),
        "431-fields": (
            431,
            "header_fields_too_large",
            b"GET /mcp HTTP/1.1\r\n"
            + b"".join(b"X-H%d: v\r\n" % n for n in range(300))
            + b"X-Request-Id: {id}\r\n\r\n",
        ),
        # A head over 256 KB: h11's own bound, before the head is whole.
        "431-head": (
            431,
            "header_fields_too_large",
            b"GET /mcp HTTP/1.1\r\nHost: x\r\nX-Request-Id: {id}\r\nX-Big: "
            + b"b" * 300_000
            + b"\r\n\r\n",
        ),
        "400": (400, "bad_request", b"NOT AN HTTP REQUEST LINE\r\nX-Request-Id: {id}\r\n\r\n"),
        # What was the SDK's app's own answer: no token.
        "401": (
            401,
            "unauthenticated",
            b"POST /mcp HTTP/1.1\r\nHost: x\r\nX-Request-Id: {id}\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
        ),
    }


def metric(server: ServedMcp, status: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=20) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("kandev_http_requests_total{") and f'status="{status}"' in line
    )


def access_lines(server: ServedMcp, request_id: str, seconds: float = 10.0) -> list[dict]:
    """The JSON access lines with ``request_id``."""
    deadline = time.monotonic() + seconds
    while True:
        found = []
        for line in server.output().splitlines():
            if line.startswith("{") and request_id in line:
                record = json.loads(line)
                if record.get("logger") == "kandev_es.access":
                    found.append(record)
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def assert_answered(server: ServedMcp, name: str, got: tuple, expected: tuple, before: float):
    (status, headers, body), (want, code) = got, expected
    assert (status, body["error"]) == (want, code), (name, body)
    assert headers["x-request-id"] == body["request_id"] == f"mcp-{name}", (name, headers, body)
    assert headers["content-type"] == "application/json", headers
    (line,) = access_lines(server, f"mcp-{name}")
    assert (line["status"], line["request_id"]) == (want, f"mcp-{name}"), line
    assert len(line["message"]) < 400, line  # the 200 KB target is not written out
    assert metric(server, want) == before + 1, name


def test_each_refusal_of_the_mcp_front_keeps_the_id_and_is_logged_and_counted(served) -> None:
    for name, (status, code, request) in refusals().items():
        before = metric(served, status)
        got = exchange(served.port, request.replace(b"{id}", f"mcp-{name}".encode()))
        assert_answered(served, name, got, (status, code), before)
    # A malformed id on a refusal is replaced like any.
    status, headers, body = exchange(
        served.port,
        b"GET /mcp HTTP/1.1\r\nHost: x\r\nX-Request-Id: no spaces allowed\r\nX-Big: "
        + b"b" * 20_000
        + b"\r\n\r\n",
    )
    assert status == 431, body
    assert headers["x-request-id"] == body["request_id"] != "no spaces allowed", body
    assert len(body["request_id"]) == 32, body


def test_what_stops_coming_is_408_with_its_id_and_a_silent_connection_is_closed(served) -> None:
    """Headers up to an id line and then nothing, or a body short of its
    length: 408 at KANDEV_HEADER_TIMEOUT / KANDEV_BODY_TIMEOUT (uvicorn held the
    first for ever, and the second until the client left). A connection that
    sends nothing is closed at KANDEV_IDLE_TIMEOUT (5 s) without a word (uvicorn
    held it for ever)."""
    silent = socket.create_connection(("127.0.0.1", served.port), timeout=15)
    opened = time.monotonic()
    cases = {
        "408-head": (
            HEADER_TIMEOUT_S,
            b"POST /mcp HTTP/1.1\r\nHost: x\r\nX-Request-Id: {id}\r\nX-Sl",
        ),
        "408-body": (
            BODY_TIMEOUT_S,
            b"POST /mcp HTTP/1.1\r\nHost: x\r\nX-Request-Id: {id}\r\n"
            b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"jsonrpc"',
        ),
    }
    for name, (timeout, request) in cases.items():
        before = metric(served, 408)
        started = time.monotonic()
        got = exchange(served.port, request.replace(b"{id}", f"mcp-{name}".encode()))
        took = time.monotonic() - started
        assert_answered(served, name, got, (408, "request_timeout"), before)
        assert timeout <= took <= timeout + 3.0, (name, took)
    with silent:
        assert silent.recv(1) == b""
        assert time.monotonic() - opened < 8.0
