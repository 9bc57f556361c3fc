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
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kandev_es.errors import InternalError, StoreUnavailable
from kandev_es.projections.feeds import feed_source
from kandev_es.storage.database import Database

if TYPE_CHECKING:
    from kandev_es.services.fanout import Subscription

MAX_PAGE = 1000
MAX_STREAM_SECONDS = 3600.0
HEARTBEAT_SECONDS = 5.0
# How often an open stream wakes at least, to see whether its client has left
# or the server stops (no statement: the reader feeds it, services/fanout.py).
WAKE_SECONDS = 0.5

# Whether the stream's client has left (the WSGI server's
# ``waitress.client_disconnected``): asked each time the stream wakes, at least
# every WAKE_SECONDS, so a client leaving an idle server frees its slot then.
ClientGone = Callable[[], bool]


def never_gone() -> bool:
    return False


# Set once, when this process stops serving (the worker's SIGTERM): every open
# stream sends a last comment and ends at once, so its client reconnects to a
# server that stays and the worker's drain is not held for a stream's life.
SERVER_STOPPING = threading.Event()


_STOPPED_BY_SERVER: weakref.WeakSet[Any] = weakref.WeakSet()


def on_server_stop(reader: Any) -> None:
    """``reader.stop()`` is called when this process stops serving."""
    _STOPPED_BY_SERVER.add(reader)


def end_open_streams() -> None:
    SERVER_STOPPING.set()
    for reader in list(_STOPPED_BY_SERVER):
        reader.stop()  # its followers end, and the streams waiting on them


class FeedEnded(InternalError):
    """A follower of the feed is ended: ``reason`` says why (a stream's last
    comment: token revoked, workspace deleted, too slow, server stopping)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class FeedItem:
    position: int
    envelope: dict[str, Any]


def _everything_visible(query: str, params: dict[str, Any]) -> None:
    return None


# Rows of a query up to a settled position (``Tasks.settled_rows``), or None
# when the store needs no such reader: what is visible is settled (SQLite).
SettledRows = Callable[[str, dict[str, Any]], list[tuple[Any, ...]] | None]

# A page's columns, in FeedItem's reading order (read_feed).
PAGE_COLUMNS = "position, event_id, type, subject, timestamp, data"
# The page as the settled reader runs it (PostgreSQL: the recorder's own
# pooled session, one statement, no transaction around it).
SETTLED_PAGE = (
    f"SELECT {PAGE_COLUMNS} FROM {{schema}}.feed_events"
    " WHERE workspace_id = %(workspace)s AND position > %(after)s AND position <= %(upto)s"
    " ORDER BY position LIMIT %(limit)s"
)


def read_feed(
    database: Database,
    workspace_id: uuid.UUID,
    after: int,
    limit: int,
    settled: SettledRows = _everything_visible,
) -> list[FeedItem]:
    """Feed rows after ``after``, only up to the settled position: rows are
    written in the saves' transactions (projections/inline.py), which commit
    out of position order, and a cursor must never pass a row still to come."""
    rows = settled(SETTLED_PAGE, {"workspace": workspace_id, "after": after, "limit": limit})
    if rows is None:
        workspace = workspace_id if database.backend == "postgres" else str(workspace_id)
        rows = database.read(
            f"SELECT {PAGE_COLUMNS} FROM feed_events"
            " WHERE workspace_id = ? AND position > ? ORDER BY position LIMIT ?",
            (workspace, after, limit),
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
    settled: SettledRows = _everything_visible,
) -> dict[str, Any]:
    items = read_feed(database, workspace_id, after, limit + 1, settled)
    page = items[:limit]
    return {
        "items": [item.envelope for item in page],
        "next_cursor": page[-1].position if page else after,
        "has_more": len(items) > limit,
    }


def sse_stream(
    follow: Callable[[], Subscription],
    max_seconds: float,
    gone: ClientGone = never_gone,
) -> Iterator[bytes]:
    """Server-Sent Events: ``id`` is the feed cursor, so a client reconnecting
    with ``Last-Event-ID`` resumes right after the last event it saw. The stream
    ends after ``max_seconds`` (clients reconnect) or when the store is lost.

    The events come from ``follow()``, a follower of the process's feed reader
    (services/fanout.py), made when the stream starts: it catches up on its own
    reads, then gets each event as the reader hands it out, as its save commits,
    the same frame bytes every stream of the workspace gets. Once its token is
    revoked or its workspace deleted (asked at each batch the reader reads and
    at least every HEARTBEAT_SECONDS), or it falls too far behind, the stream
    says why in a last comment and ends; no event read after a revocation is
    sent. Once the server stops (``end_open_streams``), it says so and ends at
    once; once its client has left (``gone``, asked at least every
    WAKE_SECONDS), it ends without a word."""
    yield b"retry: 1000\n\n"
    follower = follow()
    try:
        yield from _frames(follower, max_seconds, gone)
    finally:
        follower.close()


def _frames(follower: Subscription, max_seconds: float, gone: ClientGone) -> Iterator[bytes]:
    deadline = beat = time.monotonic()
    deadline += max_seconds
    while True:
        if SERVER_STOPPING.is_set():
            yield b": stream closed: server stopping\n\n"
            return
        if gone():
            return
        now = time.monotonic()
        if follower.caught_up and now >= deadline:
            return
        if now - beat >= HEARTBEAT_SECONDS:
            beat = now
            yield b": keepalive\n\n"
        wait = max(0.0, min(WAKE_SECONDS, deadline - now, beat + HEARTBEAT_SECONDS - now))
        try:
            events = follower.take(wait)
        except FeedEnded as ended:
            yield f": stream closed: {ended.reason}\n\n".encode()
            return
        except StoreUnavailable:
            return
        if events:
            yield b"".join(event.frame for event in events)
