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
from kandev_es.storage.notifier import SAVES, SaveBell

MAX_PAGE = 1000
MAX_STREAM_SECONDS = 3600.0
HEARTBEAT_SECONDS = 5.0
# While streams are open in a process, how often it looks at the log's head
# for saves of other processes and nodes (HeadWatch): the most that adds to
# an event's way to a stream while saves come; after the log has been still,
# less often (doubling up to WATCH_IDLE_SECONDS: an idle server's open streams
# cost it some twenty small statements a second). Its own saves wake the
# streams as they commit.
WATCH_SECONDS = 0.005
WATCH_IDLE_SECONDS = 0.05

# Why a stream's caller may no longer read it ("token revoked", "workspace
# deleted"), or None while it still may: asked afresh of the store.
EndReason = Callable[[], str | None]


def _still_allowed() -> str | None:
    return None


# Whether the stream's client has left (the WSGI server's
# ``waitress.client_disconnected``): asked each time the stream wakes, at least
# every ``poll_seconds``, so a client leaving an idle server frees its slot then.
ClientGone = Callable[[], bool]


def never_gone() -> bool:
    return False


# Set once, when this process stops serving (the worker's SIGTERM): every open
# stream sends a last comment and ends at once, so its client reconnects to a
# server that stays and the worker's drain is not held for a stream's life.
SERVER_STOPPING = threading.Event()


def end_open_streams() -> None:
    SERVER_STOPPING.set()
    SAVES.ring()  # wakes the streams waiting for a save


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
        with database.transaction() as tx:
            rows = tx.execute(
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


class HeadWatch:
    """Saves of other processes and nodes, for the open streams of this one:
    while any is open, one thread reads the head of the log every
    WATCH_SECONDS while it moves, up to WATCH_IDLE_SECONDS while it is still
    (one small statement each), and rings the save bell when it moved.
    This process's own saves ring it as they commit (storage/notifier.py)."""

    def __init__(self, bell: SaveBell = SAVES) -> None:
        self._bell = bell
        self._lock = threading.Lock()
        self._streams = 0
        self._thread: threading.Thread | None = None

    def join(self, head: Callable[[], int]) -> None:
        with self._lock:
            self._streams += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, args=(head,), name="feed-head-watch", daemon=True
                )
                self._thread.start()

    def leave(self) -> None:
        with self._lock:
            self._streams -= 1

    def running(self, wait: float = 0.0) -> bool:
        """Whether its thread still runs (after up to ``wait`` for it to end)."""
        thread = self._thread
        if thread is not None and wait:
            thread.join(wait)
        return thread is not None and thread.is_alive()

    def _run(self, head: Callable[[], int]) -> None:
        seen: int | None = None
        pause = WATCH_SECONDS
        while True:
            with self._lock:
                if self._streams <= 0:
                    self._thread = None
                    return
            try:
                now = head()
            except Exception:  # the store away, a lost session: the streams' own reads say so
                SERVER_STOPPING.wait(1.0)
                continue
            if seen is not None and now != seen:
                self._bell.ring()
                pause = WATCH_SECONDS
            else:  # a still log: look less often, up to WATCH_IDLE_SECONDS
                pause = min(pause * 2, WATCH_IDLE_SECONDS)
            seen = now
            SERVER_STOPPING.wait(pause)


HEAD_WATCH = HeadWatch()  # one per process


def sse_stream(
    database: Database,
    workspace_id: uuid.UUID,
    after: int,
    max_seconds: float,
    poll_seconds: float = 0.5,
    ended: EndReason = _still_allowed,
    settled: SettledRows = _everything_visible,
    head: Callable[[], int] | None = None,
    gone: ClientGone = never_gone,
) -> Iterator[str]:
    """Server-Sent Events: ``id`` is the feed cursor, so a client reconnecting
    with ``Last-Event-ID`` resumes right after the last event it saw. The stream
    ends after ``max_seconds`` (clients reconnect) or when the store is lost.

    Events are pushed as they commit: the stream reads again as soon as a
    save of this process commits, or ``HEAD_WATCH`` sees the log's ``head``
    move (another process's or node's save), and at least every
    ``poll_seconds``.

    ``ended`` is asked before each batch of events is sent and at least every
    ``HEARTBEAT_SECONDS``: once it names a reason (the token was revoked, the
    workspace deleted) the stream says so in a last comment and ends, so a
    revocation reaches an open stream within one heartbeat, and no event read
    after it is sent. Once the server stops (``end_open_streams``), it says
    so and ends at once; once its client has left (``gone``), it ends without
    a word."""
    if head is not None:
        HEAD_WATCH.join(head)
    try:
        yield from _events(
            database, workspace_id, after, max_seconds, poll_seconds, ended, settled, gone
        )
    finally:
        if head is not None:
            HEAD_WATCH.leave()


def _events(
    database: Database,
    workspace_id: uuid.UUID,
    after: int,
    max_seconds: float,
    poll_seconds: float,
    ended: EndReason,
    settled: SettledRows,
    gone: ClientGone,
) -> Iterator[str]:
    deadline = time.monotonic() + max_seconds
    beat = checked = time.monotonic()
    cursor = after
    yield "retry: 1000\n\n"
    while True:
        if SERVER_STOPPING.is_set():
            yield ": stream closed: server stopping\n\n"
            return
        if gone():
            return
        rung = SAVES.rung  # before the read: a save during it rings again
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
        SAVES.wait(rung, min(poll_seconds, deadline - now))
