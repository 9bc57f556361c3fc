"""Wakes the projection runners after saves, without a transaction per save.

A ``NOTIFY`` inside a save's transaction would hold PostgreSQL's one
notification-queue lock through that commit and serialise every save; one in a
transaction of its own after each save cost a second commit (with a
transaction id, so a WAL flush) per save. Here a save only marks a NOTIFY as
due; one thread per process sends it, then lets ``COALESCE_SECONDS`` pass
before the next, so the saves of that interval share one. Each save is
followed by a NOTIFY sent after its commit, at most ``COALESCE_SECONDS`` later;
a lost one (the database away) is covered by the runners' timed poll."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

log = logging.getLogger("kandev_es.storage")
COALESCE_SECONDS = 0.005
IDLE_SECONDS = 1.0


class SaveNotifier:
    def __init__(self, send: Callable[[], None], coalesce_s: float = COALESCE_SECONDS) -> None:
        self._send = send
        self._coalesce_s = coalesce_s
        self._due = threading.Event()
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._pending = False
        self.sent = 0
        # Off while no runner has anything to apply as saves come (every read
        # model written inline: bootstrap): each NOTIFY is a transaction with
        # an id of its own, a second write transaction beside the saves'.
        self.enabled = True

    def saved(self) -> None:
        """A save committed: a NOTIFY is due."""
        if not self.enabled:
            return
        self._pending = True
        self._due.set()
        thread = self._thread
        if thread is None or self._pid != os.getpid():
            self._start()

    def _start(self) -> None:
        with self._lock:
            # A forked worker inherits the attribute, not the thread.
            if self._stopped.is_set() or (self._thread is not None and self._pid == os.getpid()):
                return
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._run, name="save-notifier", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stopped.is_set():
            if not self._due.wait(IDLE_SECONDS) or self._stopped.is_set():
                continue
            self._flush()
            self._stopped.wait(self._coalesce_s)

    def _flush(self) -> None:
        self._pending = False
        self._due.clear()
        try:
            self._send()
            self.sent += 1
        except Exception as error:  # the runners' timed poll covers it
            log.debug("NOTIFY after a save not sent: %s", error)

    def stop(self) -> None:
        """Send what is due, then stop (before the store's pool closes)."""
        self._stopped.set()
        self._due.set()  # wakes the thread, which then ends
        thread = self._thread
        if thread is not None and self._pid == os.getpid():
            thread.join(timeout=IDLE_SECONDS)
        if self._pending:
            self._flush()


class SaveBell:
    """Saves committed by this process, for what waits on them (open event
    streams, services/feeds.py): a count and a condition, rung by the
    recorders right after each save commits. No waiter, no cost but a lock."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self.rung = 0

    def ring(self) -> None:
        with self._condition:
            self.rung += 1
            self._condition.notify_all()

    def wait(self, seen: int, timeout: float) -> int:
        """Until the bell has rung since ``seen`` (its count then), or
        ``timeout``; the count now."""
        with self._condition:
            self._condition.wait_for(lambda: self.rung != seen, timeout)
            return self.rung


SAVES = SaveBell()  # one per process
