"""Projection lag: from the HTTP acknowledgement of a Created to its
task.created feed row, on an idle server or (LagProber) during a load."""

from __future__ import annotations

import http.client
import threading
import time
import uuid
from collections import Counter
from typing import Any

import psycopg

from benchlib.common import WAIT_S, body, percentile
from benchlib.database import connect
from benchlib.server import Client, Gunicorn

LAG_POLL_S = 0.001


LAG_BOUND_S = 10.0


def lag_once(
    client: Client, conn: psycopg.Connection[Any], workspace: uuid.UUID, label: str
) -> float | None:
    """ms from the HTTP acknowledgement of one Created (its Completed commit is
    done) to its task.created row in the feed, polled every millisecond on
    ``conn`` (a connection of its own); None when the row is not there within
    LAG_BOUND_S. An answer other than a Created raises AssertionError."""
    status, reply = client.request("POST", "/api/v1/tasks", body(workspace, label))
    acked = time.perf_counter()
    assert status == 200 and reply.get("outcome") == "created", (status, reply)
    deadline = acked + LAG_BOUND_S
    while time.perf_counter() < deadline:
        seen = conn.execute(
            "SELECT 1 FROM feed_events WHERE subject = %s AND type = 'task.created'",
            (reply["id"],),
        ).fetchone()
        if seen:
            return (time.perf_counter() - acked) * 1000
        time.sleep(LAG_POLL_S)
    return None


def lag_summary(lags: list[float], missing: int) -> dict[str, Any]:
    return {
        "samples": len(lags),
        "p50_ms": round(percentile(lags, 0.5), 1) if lags else None,
        "p99_ms": round(percentile(lags, 0.99), 1) if lags else None,
        "missing": missing,
    }


def projection_lag(
    server: Gunicorn, token: str, workspace: uuid.UUID, url: str, schema: str, samples: int
) -> dict[str, Any]:
    """``samples`` Creates one after the other on an otherwise idle server, each
    timed by lag_once."""
    client = Client(server.port, token)
    lags: list[float] = []
    with connect(url, schema) as conn:
        for n in range(samples):
            lag = lag_once(client, conn, workspace, f"LAG-{n}-{uuid.uuid4()}")
            if lag is not None:
                lags.append(lag)
    return lag_summary(lags, samples - len(lags))


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
        self.lags: list[float] = []
        self.missing = 0
        self.failures: Counter[str] = Counter()
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        client = Client(self.port, self.token)
        with connect(self.url, self.schema) as conn:
            n = 0
            while not self.halt.is_set():
                n += 1
                try:
                    lag = lag_once(client, conn, self.workspace, f"PROBE-{n}-{uuid.uuid4()}")
                except (AssertionError, OSError, http.client.HTTPException) as error:
                    self.failures[type(error).__name__] += 1
                else:
                    if lag is None:
                        self.missing += 1
                    else:
                        self.lags.append(lag)
                self.halt.wait(self.pause_s)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.halt.set()
        self.thread.join(timeout=WAIT_S)

    def result(self) -> dict[str, Any]:
        return {
            **lag_summary(self.lags, self.missing),
            "failed_requests": dict(self.failures),
        }
