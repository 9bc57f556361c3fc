"""Streams cannot starve the server, on the default `kandev-es serve` (1 worker
x 8 request threads): 32 open SSE streams from four tokens leave /healthz and a
create answering within fixed bounds (1 s, 2 s: behaviour bounds with wide
margins, not a benchmark), and a stream beyond a cap is refused at once with 503
stream_limit_reached + Retry-After."""

from __future__ import annotations

import contextlib
import time

import pytest

from tests.support.served import ServedProcess, http, open_event_stream

STREAMS_PER_TOKEN = 8
TOKENS = 4


@pytest.fixture
def server(settings, tmp_path):
    # One worker on both backends (SQLite's default; PostgreSQL's default is two,
    # and the caps are per worker): the 33rd stream must meet the same worker.
    served = ServedProcess(settings, tmp_path, workers=1)
    yield served
    served.stop()


def test_32_open_streams_leave_healthz_and_creates_answering(server):
    tokens = []
    for _ in range(TOKENS):
        issued = http(
            "POST", server.base + "/api/v1/tokens", server.token,
            {"workspace_id": server.workspace_id},
        )
        assert issued.status in (200, 201), issued.body
        tokens.append(issued.body["token"])
    connections = []
    try:
        for token in tokens:
            for _ in range(STREAMS_PER_TOKEN):
                connection, status, _ = open_event_stream(server, token)
                connections.append(connection)
                assert status == 200, server.log()
        started = time.monotonic()
        assert http("GET", server.base + "/healthz", timeout=5).status == 200
        healthz = time.monotonic() - started
        started = time.monotonic()
        made = http(
            "POST", server.base + "/api/v1/tasks", server.token,
            {"workspace_id": server.workspace_id, "external_id": "S-1", "title": "t"},
            timeout=5,
        )
        create = time.monotonic() - started
        assert made.status == 200, made.body
        assert healthz < 1.0 and create < 2.0, (healthz, create)

        # A 9th stream on one token, and a 33rd on this worker, are refused at once.
        connection, status, headers = open_event_stream(server, tokens[0])
        connections.append(connection)
        assert status == 503 and headers.get("Retry-After"), headers
        connection, status, headers = open_event_stream(server, server.token)
        connections.append(connection)
        assert status == 503 and headers.get("Retry-After"), headers
    finally:
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.close()
    # Closed streams give their slots back.
    deadline = time.monotonic() + 20
    while True:
        connection, status, _ = open_event_stream(server, tokens[0])
        connection.close()
        if status == 200:
            break
        assert time.monotonic() < deadline, "slots never came back"
        time.sleep(0.5)
