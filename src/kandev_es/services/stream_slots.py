"""Slots for open SSE streams, per worker process and per token, so streams can
never take every request thread. A stream beyond either cap
is refused at once with 503 ``stream_limit_reached`` and Retry-After."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator

from kandev_es import metrics
from kandev_es.errors import StreamLimitReached


class StreamSlots:
    def __init__(self, per_process: int, per_token: int) -> None:
        self._per_process = per_process
        self._per_token = per_token
        self._lock = threading.Lock()
        self._open = 0
        self._by_token: Counter[uuid.UUID] = Counter()

    def take(self, token_id: uuid.UUID) -> None:
        with self._lock:
            if self._open >= self._per_process:
                metrics.stream_refused("process")
                raise StreamLimitReached(
                    "this server holds its maximum of open streams; retry later",
                    limit=self._per_process,
                )
            if self._by_token[token_id] >= self._per_token:
                metrics.stream_refused("token")
                raise StreamLimitReached(
                    "this token holds its maximum of open streams; close one or retry later",
                    limit=self._per_token,
                )
            self._open += 1
            self._by_token[token_id] += 1
        metrics.stream_opened()

    def give_back(self, token_id: uuid.UUID) -> None:
        with self._lock:
            self._open -= 1
            self._by_token[token_id] -= 1
            if self._by_token[token_id] <= 0:
                del self._by_token[token_id]
        metrics.stream_closed()


class HeldStream:
    """A response body holding one slot, given back exactly once on close() —
    which the WSGI server calls even when the stream never started (a
    generator's ``finally`` would not run then, leaking the slot)."""

    def __init__(self, slots: StreamSlots, token_id: uuid.UUID, body: Iterator[bytes]) -> None:
        self._slots, self._token_id, self._body = slots, token_id, body
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        return self._body

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            self._slots.give_back(self._token_id)
