"""Reading the task.created / task.updated feeds (written by projections/feeds.py).

The cursor is the feed row's position: the notification id of the event that
produced it. Positions only grow and a rebuild reproduces them, so a cursor a
client saved stays valid across rebuilds.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kandev_es.errors import StoreUnavailable
from kandev_es.projections.feeds import feed_source
from kandev_es.storage.database import Database

MAX_PAGE = 1000
MAX_STREAM_SECONDS = 3600.0
HEARTBEAT_SECONDS = 5.0

# Why a stream's caller may no longer read it ("token revoked", "workspace
# deleted"), or None while it still may: asked afresh of the store.
EndReason = Callable[[], str | None]


def _still_allowed() -> str | None:
    return None


# Set once, when this process stops serving (the worker's SIGTERM): every open
# stream sends a last comment and ends at once, so its client reconnects to a
# server that stays and the worker's drain is not held for a stream's life.
SERVER_STOPPING = threading.Event()


def end_open_streams() -> None:
    SERVER_STOPPING.set()


@dataclass(frozen=True)
class FeedItem:
    position: int
    envelope: dict[str, Any]


def _everything_visible() -> int | None:
    return None


# How far a reader may read (``Tasks.settled_head``): None, everything visible.
Horizon = Callable[[], int | None]


def read_feed(
    database: Database,
    workspace_id: uuid.UUID,
    after: int,
    limit: int,
    settled: Horizon = _everything_visible,
) -> list[FeedItem]:
    """Feed rows after ``after``, only up to the settled position: rows are
    written in the saves' transactions (projections/inline.py), which commit
    out of position order, and a cursor must never pass a row still to come."""
    workspace = workspace_id if database.backend == "postgres" else str(workspace_id)
    bound = settled()
    upto = "" if bound is None else " AND position <= ?"
    params: tuple[Any, ...] = (workspace, after) if bound is None else (workspace, after, bound)
    with database.transaction() as tx:
        rows = tx.execute(
            "SELECT position, event_id, type, subject, timestamp, data FROM feed_events"
            f" WHERE workspace_id = ? AND position > ?{upto} ORDER BY position LIMIT ?",
            (*params, limit),
        )
    source = feed_source(workspace_id)
    return [
        FeedItem(
            int(position),
            {
                "id": str(event_id),
                "type": kind,
                "subject": str(subject),
                "source": source,
                "timestamp": timestamp,
                "data": json.loads(data),
            },
        )
        for position, event_id, kind, subject, timestamp, data in rows
    ]


def feed_page(
    database: Database,
    workspace_id: uuid.UUID,
    after: int,
    limit: int,
    settled: Horizon = _everything_visible,
) -> dict[str, Any]:
    items = read_feed(database, workspace_id, after, limit + 1, settled)
    page = items[:limit]
    return {
        "items": [item.envelope for item in page],
        "next_cursor": page[-1].position if page else after,
        "has_more": len(items) > limit,
    }


def sse_stream(
    database: Database,
    workspace_id: uuid.UUID,
    after: int,
    max_seconds: float,
    poll_seconds: float = 0.5,
    ended: EndReason = _still_allowed,
    settled: Horizon = _everything_visible,
    stopping: threading.Event = SERVER_STOPPING,
) -> Iterator[str]:
    """Server-Sent Events: ``id`` is the feed cursor, so a client reconnecting
    with ``Last-Event-ID`` resumes right after the last event it saw. The stream
    ends after ``max_seconds`` (clients reconnect) or when the store is lost.

    ``ended`` is asked before each batch of events is sent and at least every
    ``HEARTBEAT_SECONDS``: once it names a reason (the token was revoked, the
    workspace deleted) the stream says so in a last comment and ends, so a
    revocation reaches an open stream within one heartbeat, and no event read
    after it is sent. Once ``stopping`` is set, it says so and ends at once."""
    deadline = time.monotonic() + max_seconds
    beat = checked = time.monotonic()
    cursor = after
    yield "retry: 1000\n\n"
    while True:
        if stopping.is_set():
            yield ": stream closed: server stopping\n\n"
            return
        try:
            items = read_feed(database, workspace_id, cursor, 100, settled)
            now = time.monotonic()
            if items or now - checked >= HEARTBEAT_SECONDS:
                checked = now
                reason = ended()
                if reason is not None:
                    yield f": stream closed: {reason}\n\n"
                    return
        except StoreUnavailable:
            return
        for item in items:
            cursor = item.position
            yield (
                f"id: {item.position}\nevent: {item.envelope['type']}\n"
                f"data: {json.dumps(item.envelope)}\n\n"
            )
        if len(items) == 100:
            continue
        now = time.monotonic()
        if now >= deadline:
            return
        if now - beat >= HEARTBEAT_SECONDS:
            beat = now
            yield ": keepalive\n\n"
        stopping.wait(min(poll_seconds, deadline - now))
