"""Projection lag: from the HTTP acknowledgement of a Created to its
task.created in the feed over HTTP, on an idle server or (LagProber) during a
load; and whether a list by its external ID right after the acknowledgement
has it (read your writes)."""

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


class FeedCursor:
    """Where a prober reads its workspace's feed from: the feed's end when it
    started, then past each row it found (a page holds what the load made since)."""

    def __init__(self, conn: psycopg.Connection[Any], workspace: uuid.UUID) -> None:
        row = conn.execute(
            "SELECT coalesce(max(position), 0) FROM feed_events WHERE workspace_id = %s",
            (workspace,),
        ).fetchone()
        self.after = int(row[0]) if row else 0


def lag_once(
    client: Client, conn: psycopg.Connection[Any], workspace: uuid.UUID, label: str,
    cursor: FeedCursor | None = None,
) -> tuple[float | None, bool]:
    """One Created, then what a client sees right after its acknowledgement:
    whether a list of the workspace's tasks by its external ID has it (read
    your writes), and the ms until its task.created is in the feed over HTTP
    (``GET .../events`` polled every millisecond from ``cursor``); None when it
    is not there within LAG_BOUND_S. An answer other than a Created raises
    AssertionError."""
    cursor = cursor if cursor is not None else FeedCursor(conn, workspace)
    status, reply = client.request("POST", "/api/v1/tasks", body(workspace, label))
    acked = time.perf_counter()
    assert status == 200 and reply.get("outcome") == "created", (status, reply)
    # The list goes out at once on a connection of its own, beside the feed's
    # first poll, so neither waits for the other's answer.
    listed: dict[str, Any] = {}
    lister = threading.Thread(target=lambda: listed.update(
        answer=Client(client.port, client.token).request(
            "GET", f"/api/v1/workspaces/{workspace}/tasks?external_id={label}")))
    lister.start()
    lag = _feed_lag(client, workspace, reply["id"], cursor, acked)
    lister.join(WAIT_S)
    status, page = listed.get("answer", (0, None))
    found = status == 200 and [t["id"] for t in page["items"]] == [reply["id"]]
    return lag, found


def _feed_lag(
    client: Client, workspace: uuid.UUID, task_id: str, cursor: FeedCursor, acked: float
) -> float | None:
    """ms from ``acked`` until the task's task.created is in the feed over HTTP."""
    deadline = acked + LAG_BOUND_S
    after = cursor.after
    while time.perf_counter() < deadline:
        status, page = client.request(
            "GET", f"/api/v1/workspaces/{workspace}/events?after={after}&limit=1000")
        assert status == 200, (status, page)
        for item in page["items"]:
            if item["subject"] == task_id and item["type"] == "task.created":
                cursor.after = after
                return (time.perf_counter() - acked) * 1000
        after = page["next_cursor"]
        if not page["has_more"]:
            time.sleep(LAG_POLL_S)
    return None


def lag_summary(lags: list[float], missing: int, unlisted: int = 0) -> dict[str, Any]:
    return {
        "samples": len(lags),
        "p50_ms": round(percentile(lags, 0.5), 1) if lags else None,
        "p99_ms": round(percentile(lags, 0.99), 1) if lags else None,
        "missing": missing,
        # Creates whose list by external ID, right after the 200, did not have it.
        "not_listed_at_once": unlisted,
    }


def projection_lag(
    server: Gunicorn, token: str, workspace: uuid.UUID, url: str, schema: str, samples: int
) -> dict[str, Any]:
    """``samples`` Creates one after the other on an otherwise idle server, each
    timed by lag_once."""
    client = Client(server.port, token)
    lags: list[float] = []
    unlisted = 0
    with connect(url, schema) as conn:
        cursor = FeedCursor(conn, workspace)
        for n in range(samples):
            lag, listed = lag_once(client, conn, workspace, f"LAG-{n}-{uuid.uuid4()}", cursor)
            unlisted += not listed
            if lag is not None:
                lags.append(lag)
    return lag_summary(lags, samples - len(lags), unlisted)


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
        self.unlisted = 0
        self.failures: Counter[str] = Counter()
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        client = Client(self.port, self.token)
        with connect(self.url, self.schema) as conn:
            cursor = FeedCursor(conn, self.workspace)
            n = 0
            while not self.halt.is_set():
                n += 1
                try:
                    lag, listed = lag_once(
                        client, conn, self.workspace, f"PROBE-{n}-{uuid.uuid4()}", cursor
                    )
                except (AssertionError, OSError, http.client.HTTPException) as error:
                    self.failures[type(error).__name__] += 1
                else:
                    self.unlisted += not listed
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
            **lag_summary(self.lags, self.missing, self.unlisted),
            "failed_requests": dict(self.failures),
        }
