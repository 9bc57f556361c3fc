"""How the deliverer reads a workspace's feed: the feed service's settled
read (services/feeds.py), a page of up to 100 events (deliverer.PAGE) from each
subscription's cursor, and one head watch shared by every waiting
subscription of this process.

Not through the process's feed reader (services/fanout.py), which SSE
streams share: the deliverer runs in the background process, where no stream
follows the feed, so the reader would run for it alone and save no read; a
page read is one statement per 100 deliveries (28 reads for 2,000 events
replayed, about 0.15 ms a delivery in cProfile, against the POST's own time),
and a subscription held back by a failing receiver for hours would be ended
by the reader past 2,000 events each time and read again from its cursor
anyway. The interface stays small so that it could stand behind it."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Protocol

from kandev_es.services.feeds import FeedItem, SettledRows, read_feed
from kandev_es.storage.database import Database

HEAD_SECONDS = 0.05  # how often waiting subscriptions look at the log's head, together


class FeedReader(Protocol):
    def read(self, workspace_id: uuid.UUID, after: int, limit: int) -> list[FeedItem]:
        """Feed events of the workspace after ``after``, in feed order, only
        up to a settled position (none still to come below them)."""
        ...

    def head(self) -> int:
        """A number that moves when anything may have been added to a feed."""
        ...

    def wait(self, seen: int, timeout: float, stop: threading.Event) -> None:
        """Until ``head()`` moves past ``seen``, ``timeout`` passes or ``stop``."""
        ...


class StoreFeed:
    """The feed as the JSON feed reads it, the log's head read at most once
    per HEAD_SECONDS for every subscription of the process."""

    def __init__(self, database: Database, settled: SettledRows, head: Callable[[], int]):
        self._database = database
        self._settled = settled
        self._read_head = head
        self._lock = threading.Lock()
        self._head = -1
        self._read_at = 0.0

    def read(self, workspace_id: uuid.UUID, after: int, limit: int) -> list[FeedItem]:
        return read_feed(self._database, workspace_id, after, limit, self._settled)

    def head(self) -> int:
        with self._lock:
            now = time.monotonic()
            if now - self._read_at >= HEAD_SECONDS:
                self._head = self._read_head()
                self._read_at = now
            return self._head

    def wait(self, seen: int, timeout: float, stop: threading.Event) -> None:
        deadline = time.monotonic() + timeout
        while not stop.is_set() and time.monotonic() < deadline:
            if self.head() != seen:
                return
            stop.wait(HEAD_SECONDS)
