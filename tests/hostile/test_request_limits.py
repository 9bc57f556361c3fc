"""A request's head is bounded part by part, as a production front end bounds it
(gunicorn's defaults: request line 4094 bytes, 100 header fields, 8190 bytes per
field), answered 414 / 431 in the API's JSON error shape before the application
sees anything; and connections holding unfinished bodies cost the worker little
memory (docs/security.md: Input limits and streams). Over a real served process,
on both backends."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from kandev_es.config import Settings
from tests.support.load import worker_pids
from tests.support.served import ServedProcess, http

BODIES = 200
BODY_BYTES = 500_000
RSS_MARGIN_KB = 20 * 1024


@pytest.fixture
def served(settings: Settings, tmp_path: Path):  # type: ignore[no-untyped-def]
    server = ServedProcess(settings, tmp_path)
    yield server
    server.stop()


def raw_answer(port: int, head: bytes) -> tuple[int, dict[str, object]]:
    """Send ``head`` as it is; the status and JSON body of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    body = rest.partition(b"\r\n\r\n")[2]
    return int(status_line.split()[1]), json.loads(body)


def test_heads_over_each_bound_are_refused_with_json_errors(served: ServedProcess) -> None:
    ok = http("GET", served.base + "/healthz", headers={f"X-H{n}": "v" * 100 for n in range(90)})
    assert ok.status == 200, ok.body
    # Far past each bound (the 200 KB URL, 20,000 headers, one 200 KB
    # header, all once answered 200): refused once the bound is passed, and the
    # client still sending gets its answer (the server lingers, no reset).
    long_url = b"GET /healthz?" + b"q" * 200_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    status, body = raw_answer(served.port, long_url)
    assert (status, body["error"]) == (414, "request_line_too_long"), body
    many = b"".join(b"X-H%d: v\r\n" % n for n in range(20_000))
    status, body = raw_answer(served.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
    assert (status, body["error"]) == (431, "header_fields_too_large"), body
    big = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 200_000 + b"\r\n\r\n"
    status, body = raw_answer(served.port, big)
    assert (status, body["error"]) == (431, "header_fields_too_large"), body


def worker_rss_kb(server: ServedProcess) -> int:
    """The one worker's resident memory (serve on SQLite: one worker process)."""
    (worker,) = worker_pids(server.process.pid)  # not the background process beside it
    for line in Path(f"/proc/{worker}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def settled_rss_kb(server: ServedProcess, seconds: float = 10.0) -> int:
    """The worker's RSS once two readings 0.5 s apart agree within 1 MB."""
    deadline = time.monotonic() + seconds
    last = worker_rss_kb(server)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = worker_rss_kb(server)
        if abs(now - last) < 1024:
            return now
        last = now
    return last


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_unfinished_bodies_leave_the_worker_memory_near_idle(served: ServedProcess) -> None:
    """200 connections each sending 500 KB of a create's body and never the
    last byte: the worker holds a bounded part of each in memory
    (KANDEV_BODY_MEMORY_BYTES, 16 KiB) and the rest in temporary files, so its
    RSS stays within 20 MB of idle (waitress' default of 512 KiB in memory
    took it up 56 MB)."""
    idle = settled_rss_kb(served)
    head = (
        f"POST /api/v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {BODY_BYTES}\r\n\r\n"
    ).encode()
    held = []
    try:
        for _ in range(BODIES):
            sock = socket.create_connection(("127.0.0.1", served.port), timeout=10)
            sock.sendall(head + b" " * (BODY_BYTES - 1))
            held.append(sock)
        loaded = settled_rss_kb(served)
    finally:
        for sock in held:
            sock.close()
    print(f"worker RSS idle {idle} kB, with {BODIES} unfinished bodies {loaded} kB")
    assert loaded - idle < RSS_MARGIN_KB, (idle, loaded)
