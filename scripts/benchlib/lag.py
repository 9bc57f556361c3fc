"""Projection lag: from the HTTP acknowledgement of a Created to its
task.created in the feed over HTTP, on an idle server or (LagProber) during a
load; and whether a list by its external ID right after the acknowledgement
has it (read your writes)."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psycopg

from benchlib.common import WAIT_S, body, percentile
from benchlib.database import connect
from benchlib.server import Client, Gunicorn

LAG_POLL_S = 0.001


LAG_BOUND_S = 10.0


class FeedCursor:
    """Where a prober reads its workspace's feed from: the feed's end when it
    started, then past each row it found (a page holds what the load made since)."""

    def __init__(self, conn: psycopg.Connection[Any], workspace: uuid.UUID) -> None:
        row = conn.execute(
            "SELECT coalesce(max(position), 0) FROM feed_events WHERE workspace_id = %s",
            (workspace,),
        ).fetchone()
        self.after = int(row[0]) if row else 0


@dataclass
class Sample:
    """One probe: its Created's round trip, then each feed poll after the
    acknowledgement (sent, answered: ms after it) and which one had the row."""

    create_ms: float
    task_id: str = ""
    acked: float = 0.0  # perf_counter() at the acknowledgement
    listed: bool = False
    polls: list[tuple[float, float]] = field(default_factory=list)
    lag_ms: float | None = None  # None: not in the feed within LAG_BOUND_S

    @property
    def first_poll_had_it(self) -> bool:
        return self.lag_ms is not None and len(self.polls) == 1


def lag_once(
    client: Client, conn: psycopg.Connection[Any], workspace: uuid.UUID, label: str,
    cursor: FeedCursor | None = None,
) -> Sample:
    """One Created, then what a client sees right after its acknowledgement:
    whether a list of the workspace's tasks by its external ID has it (read
    your writes), and the ms until its task.created is in the feed over HTTP
    (``GET .../events`` polled every millisecond from ``cursor``); None when it
    is not there within LAG_BOUND_S. An answer other than a Created raises
    AssertionError."""
    cursor = cursor if cursor is not None else FeedCursor(conn, workspace)
    sent = time.perf_counter()
    status, reply = client.request("POST", "/api/v1/tasks", body(workspace, label))
    acked = time.perf_counter()
    assert status == 200 and reply.get("outcome") == "created", (status, reply)
    sample = Sample(create_ms=(acked - sent) * 1000, task_id=reply["id"], acked=acked)
    # The list goes out at once on a connection of its own, beside the feed's
    # first poll, so neither waits for the other's answer.
    listed: dict[str, Any] = {}
    lister = threading.Thread(target=lambda: listed.update(
        answer=Client(client.port, client.token).request(
            "GET", f"/api/v1/workspaces/{workspace}/tasks?external_id={label}")))
    lister.start()
    _feed_lag(client, workspace, reply["id"], cursor, acked, sample)
    lister.join(WAIT_S)
    status, page = listed.get("answer", (0, None))
    sample.listed = status == 200 and [t["id"] for t in page["items"]] == [reply["id"]]
    return sample


def _feed_lag(
    client: Client, workspace: uuid.UUID, task_id: str, cursor: FeedCursor, acked: float,
    sample: Sample,
) -> None:
    """ms from ``acked`` until the task's task.created is in the feed over
    HTTP, with each poll's times, into ``sample``."""
    deadline = acked + LAG_BOUND_S
    after = cursor.after
    while time.perf_counter() < deadline:
        sent = time.perf_counter()
        status, page = client.request(
            "GET", f"/api/v1/workspaces/{workspace}/events?after={after}&limit=1000")
        answered = time.perf_counter()
        sample.polls.append(((sent - acked) * 1000, (answered - acked) * 1000))
        assert status == 200, (status, page)
        after = page["next_cursor"]
        if any(item["subject"] == task_id and item["type"] == "task.created"
               for item in page["items"]):
            # As a feed client goes on: past everything this page held (the
            # next probe's row commits after this answer, so above it).
            cursor.after = after
            sample.lag_ms = (answered - acked) * 1000
            return
        if not page["has_more"]:
            time.sleep(LAG_POLL_S)


def _p(values: list[float], fraction: float) -> float | None:
    return round(percentile(values, fraction), 1) if values else None


def lag_summary(samples: list[Sample]) -> dict[str, Any]:
    """The lags' percentiles, with what explains them: whether the first poll
    after the acknowledgement already had the row (then the lag is that one
    GET's round trip), how many polls it took, a poll's own round trip and the
    Created's (what one request takes under the same load)."""
    lags = [s.lag_ms for s in samples if s.lag_ms is not None]
    first_trips = [s.polls[0][1] - s.polls[0][0] for s in samples if s.polls]
    trips = [answered - sent for s in samples for sent, answered in s.polls]
    return {
        "samples": len(lags),
        "p50_ms": _p(lags, 0.5),
        "p99_ms": _p(lags, 0.99),
        "missing": len(samples) - len(lags),
        # Creates whose list by external ID, right after the 200, did not have it.
        "not_listed_at_once": sum(not s.listed for s in samples),
        "first_poll_had_it": sum(s.first_poll_had_it for s in samples),
        "polls_p50": _p([float(len(s.polls)) for s in samples], 0.5),
        "polls_max": max((len(s.polls) for s in samples), default=0),
        "first_poll_sent_ms_p50": _p([s.polls[0][0] for s in samples if s.polls], 0.5),
        "first_poll_round_trip_ms": {"p50": _p(first_trips, 0.5), "p99": _p(first_trips, 0.99)},
        "poll_round_trip_ms": {"p50": _p(trips, 0.5), "p99": _p(trips, 0.99)},
        "created_round_trip_ms": {
            "p50": _p([s.create_ms for s in samples], 0.5),
            "p99": _p([s.create_ms for s in samples], 0.99),
        },
    }


def projection_lag(
    server: Gunicorn, token: str, workspace: uuid.UUID, url: str, schema: str, samples: int
) -> dict[str, Any]:
    """``samples`` Creates one after the other on an otherwise idle server, each
    timed by lag_once."""
    client = Client(server.port, token)
    with connect(url, schema) as conn:
        cursor = FeedCursor(conn, workspace)
        taken = [
            lag_once(client, conn, workspace, f"LAG-{n}-{uuid.uuid4()}", cursor)
            for n in range(samples)
        ]
    return lag_summary(taken)


class StreamWatcher:
    """A feed consumer on the SSE stream (``GET .../events/stream``), as a
    client that follows the feed uses it: a thread of its own reading every
    event as it is pushed, noting when each task.created arrived."""

    def __init__(self, port: int, token: str, workspace: uuid.UUID, after: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.path = f"/api/v1/workspaces/{workspace}/events/stream?after={after}&max_seconds=120"
        self.token = token
        self.arrived: dict[str, float] = {}
        self.failure: str | None = None
        self.stopping = False
        self.thread = threading.Thread(target=self.run, daemon=True)

    def start(self) -> None:
        self.conn.connect()
        # The socket itself: http.client lets go of it once the response is
        # read to the connection's end, and only shutting it down ends the read.
        self.sock = self.conn.sock
        self.conn.request("GET", self.path, headers={"Authorization": f"Bearer {self.token}"})
        self.response = self.conn.getresponse()
        assert self.response.status == 200, self.response.status
        self.thread.start()

    def run(self) -> None:
        kind = ""
        try:
            while True:
                line = self.response.readline()
                if not line:
                    return
                if line.startswith(b"event: "):
                    kind = line[7:].strip().decode()
                elif line.startswith(b"data: ") and kind == "task.created":
                    self.arrived.setdefault(json.loads(line[6:])["subject"], time.perf_counter())
        except (OSError, http.client.HTTPException, ValueError) as error:
            if not self.stopping:
                self.failure = type(error).__name__

    def stop(self) -> None:
        # Closing the connection alone leaves the socket open under the
        # response being read (and the server pushing to it): shut it down,
        # which also ends the blocked read; the server ends the stream at its
        # next write.
        self.stopping = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.thread.join(timeout=WAIT_S)
        self.response.close()
        self.conn.close()

    def lags(self, samples: list[Sample]) -> dict[str, Any]:
        """ms from each probe's acknowledgement to its task.created on the
        stream (negative: pushed before the creating client had its answer)."""
        lags = [(self.arrived[s.task_id] - s.acked) * 1000
                for s in samples if s.task_id in self.arrived]
        return {
            "samples": len(lags),
            "p50_ms": _p(lags, 0.5),
            "p99_ms": _p(lags, 0.99),
            "missing": len(samples) - len(lags),
            "failure": self.failure,
        }


class LagProber:
    """Projection lag while a load runs: a thread of its own creating its own
    tasks one at a time (lag_once, then a pause of ``pause_s``) from start()
    to stop(). Its requests are not the load's: they count in no rate."""

    def __init__(
        self, port: int, token: str, workspace: uuid.UUID, url: str, schema: str,
        pause_s: float = 0.02,
    ) -> None:
        self.port, self.token, self.workspace = port, token, workspace
        self.url, self.schema, self.pause_s = url, schema, pause_s
        self.samples: list[Sample] = []
        self.stream: StreamWatcher | None = None
        self.failures: Counter[str] = Counter()
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        client = Client(self.port, self.token)
        with connect(self.url, self.schema) as conn:
            cursor = FeedCursor(conn, self.workspace)
            self.stream = StreamWatcher(self.port, self.token, self.workspace, cursor.after)
            self.stream.start()
            n = 0
            while not self.halt.is_set():
                n += 1
                try:
                    self.samples.append(lag_once(
                        client, conn, self.workspace, f"PROBE-{n}-{uuid.uuid4()}", cursor
                    ))
                except (AssertionError, OSError, http.client.HTTPException) as error:
                    self.failures[type(error).__name__] += 1
                self.halt.wait(self.pause_s)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.halt.set()
        self.thread.join(timeout=WAIT_S)
        time.sleep(0.5)  # the last probes' events on the stream
        if self.stream is not None:
            self.stream.stop()

    def result(self) -> dict[str, Any]:
        return {
            **lag_summary(self.samples),
            "stream": None if self.stream is None else self.stream.lags(self.samples),
            "failed_requests": dict(self.failures),
        }
