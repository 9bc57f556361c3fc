"""A client that leaves an open event stream on an idle server gives its slot
back within seconds (issue 42, point 4): the worker keeps reading a connection
while its stream is served, so it sees the client's FIN at once, and the
stream asks about it each time it wakes (at least every half second). Before,
it was noticed only at the stream's next write (10-20 s: a keep-alive into a
closed socket succeeds, the one after it fails). `kandev-es serve`, both
backends, with one stream allowed per token: the token's next stream is
refused (503) until the first one's slot is free again."""

from __future__ import annotations

import time

import pytest

from tests.support.served import ServedProcess, http, open_event_stream

FREED_WITHIN_S = 3.0  # a wake (0.5 s) and the worker's loop, with room for a loaded machine
# The stalled-reader case's send timeout (KANDEV_SEND_TIMEOUT, 60 s by default):
# what it shows does not depend on its length, a minute of waiting would prove no more.
SEND_TIMEOUT_S = 8


@pytest.fixture
def server(settings, tmp_path):
    served = ServedProcess(
        settings, tmp_path, workers=1, KANDEV_MAX_STREAMS_PER_TOKEN="1",
        KANDEV_SEND_TIMEOUT=str(SEND_TIMEOUT_S),
    )
    yield served
    served.stop()


def test_a_client_leaving_an_idle_stream_frees_its_slot_within_seconds(server):
    issued = http(
        "POST",
        server.base + "/api/v1/tokens",
        server.token,
        {"workspace_id": server.workspace_id},
    )
    assert issued.status == 201, issued.body
    token = issued.body["token"]
    first, status, _ = open_event_stream(server, token)
    assert status == 200, server.log()
    time.sleep(1.0)  # idle: nothing is written to it, no save wakes it
    refused, status, _ = open_event_stream(server, token)
    refused.close()
    assert status == 503, "the token's one stream is held"

    first.close()  # the client leaves; the server writes nothing that would fail
    left_at = time.monotonic()
    while True:
        again, status, _ = open_event_stream(server, token)
        again.close()
        if status == 200:
            break
        assert time.monotonic() - left_at < 30, "the slot never came back"
        time.sleep(0.1)
    freed_s = time.monotonic() - left_at
    print(f"slot freed {freed_s:.2f} s after the client left")
    assert freed_s < FREED_WITHIN_S, freed_s


def test_a_client_that_stops_reading_its_stream_is_let_go_after_the_send_timeout(server):
    """A client that keeps its connection but takes nothing more: once what
    waits for it has not moved for the worker's send timeout (KANDEV_SEND_TIMEOUT,
    8 s here), the connection is closed and the stream's thread and slot are
    free again (before, they were held for as long as the client kept the
    connection); not sooner: its stream stopped moving after it connected, so
    it is let go at least the send timeout after that."""
    import socket

    issued = http(
        "POST", server.base + "/api/v1/tokens", server.token,
        {"workspace_id": server.workspace_id},
    )
    token = issued.body["token"]
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect(("127.0.0.1", server.port))
    connected_at = time.monotonic()
    stalled.sendall(
        f"GET /api/v1/workspaces/{server.workspace_id}/events/stream?max_seconds=600 HTTP/1.1"
        f"\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
    )
    assert b" 200 " in stalled.recv(1024)  # then it reads nothing more
    try:
        for n in range(60):  # about 6 MB of frames: more than the sockets hold
            made = http(
                "POST", server.base + "/api/v1/tasks", server.token,
                {"workspace_id": server.workspace_id, "title": f"big {n}",
                 "description": "d" * 99_000},
            )
            assert made.status == 200, made.body
        filled_at = time.monotonic()
        while True:
            again, status, _ = open_event_stream(server, token)
            again.close()
            if status == 200:
                break
            assert time.monotonic() - filled_at < SEND_TIMEOUT_S + 60, (
                "the stalled stream was never let go")
            time.sleep(0.25)
        freed_at = time.monotonic()
    finally:
        stalled.close()
    print(f"stalled stream let go {freed_at - filled_at:.1f} s after its last event,"
          f" {freed_at - connected_at:.1f} s after it connected (creates took"
          f" {filled_at - connected_at:.1f} s)")
    assert freed_at - connected_at >= SEND_TIMEOUT_S, (
        "let go before its send timeout: a slow reader must not be cut")
