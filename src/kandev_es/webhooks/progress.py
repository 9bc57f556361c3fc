"""What one subscription's thread knows between deliveries, and how its
progress reaches the database.

A 2xx moves the subscription's cursor in memory at once (the next event goes
out without waiting for a write); the cursor, the attempts' log rows and
their counts are written together by the deliverer's flusher every
FLUSH_SECONDS, so one write transaction carries the deliveries of those
milliseconds instead of one each. A failure is written at once, with
whatever was waiting. The cursor in the database is still moved only past
events that were answered 2xx; a deliverer killed before a write sends the
events of those last milliseconds again, with their own webhook-ids, in
order. Every write is guarded by the cursor and generation it was read with:
an operator's pause, resume, replay, rotation or deletion (each bumps the
generation) makes it refuse the move, and the thread reads the subscription
afresh.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import replace
from typing import Any

from kandev_es.services.feeds import FeedItem
from kandev_es.webhooks.store import Attempt, Subscription, SubscriptionStore

FLUSH_SECONDS = 0.02
MAX_UNWRITTEN = 200


class Progress:
    def __init__(self, subscription_id: uuid.UUID) -> None:
        self.id = subscription_id
        self.lock = threading.Lock()  # the state below, never held over a write
        self.writing = threading.Lock()  # one write of it at a time
        self.s: Subscription | None = None  # as this thread has it: ahead of ``written``
        self.written: Subscription | None = None  # as last read from or written to the store
        self.read_at = 0.0
        self.items: list[FeedItem] = []
        self.unwritten: list[Attempt] = []
        self.refused = False  # a write's guard refused: read the subscription again

    def adopt(self, fresh: Subscription, now: float) -> None:
        """The subscription as just read from the store (nothing unwritten)."""
        with self.lock:
            self.s = self.written = fresh
            self.items, self.refused, self.read_at = [], False, now

    def stale(self, now: float, every: float) -> bool:
        return self.s is None or self.refused or now - self.read_at > every

    def advance(self, attempt: Attempt | None, position: int, done: int) -> None:
        """Past ``position`` in memory (a 2xx, or events of other types)."""
        with self.lock:
            if attempt is not None:
                self.unwritten.append(attempt)
            if self.s is not None and not self.refused:
                self.s = replace(self.s, cursor=position, attempts=0, next_attempt_at=0.0)
                del self.items[:done]

    def due(self) -> bool:
        s, written = self.s, self.written
        return bool(self.unwritten) or (
            s is not None and written is not None and s.cursor != written.cursor
        )

    def flush(
        self,
        store: SubscriptionStore,
        extra: Attempt | None = None,
        changes: dict[str, Any] | None = None,
    ) -> bool:
        """Write what is unwritten (and ``extra`` with its ``changes``) in one
        transaction; whether the subscription took the changes. One write at a
        time (``writing``); ``lock`` is held only to take and settle the state,
        never over the write, so the delivering thread goes on meanwhile."""
        with self.writing:
            with self.lock:
                attempts = self.unwritten + ([extra] if extra is not None else [])
                self.unwritten = []
                s, written, refused = self.s, self.written, self.refused
            try:
                if s is None or written is None or refused:
                    if attempts:
                        store.record(None, attempts, {})
                    return False
                moves = self._moves(s, changes)
                # The store away: nothing is written, everything stays for the
                # next try (a failure's changes are decided again by its retry).
                stored = store.record(written, attempts, moves)
            except BaseException:
                with self.lock:
                    self.unwritten[:0] = [a for a in attempts if a is not extra]
                raise
            return self._settle(s, written, moves, stored)

    @staticmethod
    def _moves(s: Subscription, changes: dict[str, Any] | None) -> dict[str, Any]:
        return {
            "cursor": s.cursor,
            "attempts": s.attempts,
            "next_attempt_at": s.next_attempt_at,
            **(changes or {}),
        }

    def _settle(
        self, s: Subscription, written: Subscription, moves: dict[str, Any], stored: bool
    ) -> bool:
        """After a write of ``s`` (as it was when taken): the stored state, and
        this thread's own unless it moved on during the write."""
        with self.lock:
            if not stored:
                self.refused = True
                return False
            self.written = replace(written, **moves)
            if self.s is s:
                self.s = self.written
            return True
