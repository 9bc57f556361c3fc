"""The HTTP front's own refusals are answers like any other (issue 46 point 1;
docs/observability.md: Request ids): a 2 MB body (413), a 5,000-character URL
(414), oversized headers (431), a malformed request line (400) and a request
whose headers stop coming (408) each keep the caller's well-formed
X-Request-Id, write an access line with it and count in /metrics under their
status. Over a real served process (waitress under gunicorn), on both backends."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from kandev_es.config import Settings
from tests.support.served import ServedProcess

HEADER_TIMEOUT_S = 2


@pytest.fixture
def served(settings: Settings, tmp_path: Path):  # type: ignore[no-untyped-def]
    server = ServedProcess(
        settings, tmp_path, KANDEV_HEADER_TIMEOUT=str(HEADER_TIMEOUT_S), KANDEV_LOG_FORMAT="json"
    )
    yield server
    server.stop()


def exchange(port: int, data: bytes, pause_s: float = 0.0) -> tuple[int, dict[str, str], dict]:
    """Send ``data`` as it is (and no more); the answer's status, headers and JSON body."""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, json.loads(body)


def refusals() -> dict[str, tuple[int, str, bytes]]:
    """Each refusal: (status, error code, the request with {id} where its id goes)."""
    return {
        "413": (
            413,
            "payload_too_large",
            b"POST /api/v1/tasks HTTP/1.1\r\nHost: x\r\nX-Request-Id: {id}\r\n"
            b"Content-Type: application/json\r\nContent-Length: 2000000\r\n\r\n" + b"x" * 2_000_000,
        ),
        "414": (
            414,
            "request_line_too_long",
            b"GET /api/v1/tasks?q="
            + b"q" * 5000
            + b" HTTP/1.1\r\nHost: x\r\nX-Request-Id: {id}\r\n\r\n",
        ),
        # The id comes after 200 KB of head the front refused at its first 8 KB.
        "414-late-id": (
            414,
            "request_line_too_long",
            b"GET /healthz?q="
            + b"q" * 200_000
            + b" HTTP/1.1\r\nHost: x\r\n"
            + b"".join(b"X-H%d: v\r\n" % n for n in range(50))
            + b"X-Request-Id: {id}\r\n\r\n",
        ),
        "431": (
            431,
            "header_fields_too_large",
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Request-Id: {id}\r\nX-Big: "
            + b"b" * 20_000
            + b"\r\n\r\n",
        ),
        "431-fields": (
            431,
            "header_fields_too_large",
            b"GET /healthz HTTP/1.1\r\n"
            + b"".join(b"X-H%d: v\r\n" % n for n in range(300))
            + b"X-Request-Id: {id}\r\n\r\n",
        ),
        "400": (400, "bad_request", b"NOT AN HTTP REQUEST LINE\r\nX-Request-Id: {id}\r\n\r\n"),
    }


def metric(server: ServedProcess, status: int) -> float:
    with urllib.request.urlopen(server.base + "/metrics", timeout=20) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("kandev_http_requests_total{") and f'status="{status}"' in line
    )


def access_lines(server: ServedProcess, request_id: str, seconds: float = 10.0) -> list[dict]:
    """The JSON access lines with ``request_id`` (a worker writes one once the answer is out)."""
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


def test_each_refusal_of_the_front_keeps_the_id_and_is_logged_and_counted(served) -> None:
    for name, (status, code, request) in refusals().items():
        request_id = f"front-{name}"
        before = metric(served, status)
        got, headers, body = exchange(served.port, request.replace(b"{id}", request_id.encode()))
        assert (got, body["error"]) == (status, code), (name, body)
        assert headers["x-request-id"] == body["request_id"] == request_id, (name, headers, body)
        assert headers["content-type"] == "application/json", headers
        (line,) = access_lines(served, request_id)
        assert (line["status"], line["request_id"]) == (status, request_id), line
        assert len(line["message"]) < 400, line  # the 200 KB target is not written out
        assert metric(served, status) == before + 1, name


def test_a_request_whose_headers_stop_coming_is_408_with_its_id(served) -> None:
    """Headers up to an id line and then nothing: at KANDEV_HEADER_TIMEOUT the
    front answers 408 (it used to close the connection without a word)."""
    before = metric(served, 408)
    started = time.monotonic()
    status, headers, body = exchange(
        served.port, b"POST /api/v1/tasks HTTP/1.1\r\nHost: x\r\nX-Request-Id: front-408\r\nX-Sl"
    )
    took = time.monotonic() - started
    assert (status, body["error"]) == (408, "request_timeout"), body
    assert headers["x-request-id"] == body["request_id"] == "front-408", (headers, body)
    assert HEADER_TIMEOUT_S <= took <= HEADER_TIMEOUT_S + 3.0, took
    (line,) = access_lines(served, "front-408")
    assert line["status"] == 408, line
    assert metric(served, 408) == before + 1


def test_a_malformed_id_on_a_refusal_is_replaced_like_any(served) -> None:
    status, headers, body = exchange(
        served.port,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Request-Id: no spaces allowed\r\nX-Big: "
        + b"b" * 20_000
        + b"\r\n\r\n",
    )
    assert status == 431, body
    assert headers["x-request-id"] == body["request_id"] != "no spaces allowed", body
    assert len(body["request_id"]) == 32, body
