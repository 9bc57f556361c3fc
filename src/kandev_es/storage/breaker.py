"""Fail fast while the database is down. Once a store call has found no
connection to be had, every caller would otherwise wait out the pool timeout
again; instead the breaker answers ``StoreUnavailable`` at once and lets one call through at a
time, at most every ``probe_interval`` seconds, to find out whether the
database is back (that call is the probe — no separate health query)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kandev_es import metrics
from kandev_es.errors import StoreUnavailable

log = logging.getLogger("kandev_es.store")


def means_unreachable(error: BaseException) -> bool:
    """Only "no connection could be had in time" opens the breaker. A single
    dead connection (a restart leaves some behind) or a query-level failure
    such as a deadlock says nothing about the next call."""
    from psycopg_pool import PoolTimeout

    return isinstance(error, PoolTimeout) or isinstance(error.__cause__, PoolTimeout)


# SQLSTATEs that say this connection's server is not (or no longer) a usable
# primary: a standby or a node gone read-only (25006), a server shutting down,
# crashed or starting (57P01-57P04), a broken connection (class 08).
_READ_ONLY = "25006"
_NODE_GONE_CLASSES = ("57P", "08")


def _psycopg_error(error: BaseException) -> BaseException | None:
    import psycopg

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, psycopg.Error):
            return seen
        seen = seen.__cause__
    return None


def means_read_only(error: BaseException) -> bool:
    """The server refused a write as read-only: a standby, or a primary being
    demoted (SQLSTATE 25006, ``cannot execute ... in a read-only transaction``)."""
    found = _psycopg_error(error)
    return found is not None and getattr(found, "sqlstate", None) == _READ_ONLY


def means_node_lost(error: BaseException) -> bool:
    """This connection's server is gone or is the wrong one, as in a failover:
    read-only (a standby), shut down, crashed, starting up, or the connection
    broke. Every pooled connection made before it is suspect (they were opened
    to the same node), so the pool is drained; new ones go where the URL's
    ``target_session_attrs`` finds the primary. A pool timeout is not this
    (nothing was reached: see ``means_unreachable``), nor is a query-level
    failure such as a deadlock."""
    import psycopg

    found = _psycopg_error(error)
    if found is None or means_unreachable(error):
        return False
    state = getattr(found, "sqlstate", None)
    if state is None:  # psycopg's own: the connection closed or broke under us
        return isinstance(found, (psycopg.OperationalError, psycopg.InterfaceError))
    return bool(state == _READ_ONLY or str(state).startswith(_NODE_GONE_CLASSES))


class StoreBreaker:
    def __init__(
        self, probe_interval: float = 0.5, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._interval = probe_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._open_since: float | None = None
        self._next_probe = 0.0
        self._probing = False
        self._reason = ""

    @property
    def is_open(self) -> bool:
        return self._open_since is not None

    def admit(self) -> bool:
        """Raise at once while open, except for the one caller chosen to probe.
        Returns True when this caller is that probe (report with ``succeeded``
        or ``failed``)."""
        if self._open_since is None:  # the common case takes no lock
            return False
        with self._lock:
            if self._open_since is None:
                return False
            now = self._clock()
            if self._probing or now < self._next_probe:
                down = now - self._open_since
                raise StoreUnavailable(
                    f"database unavailable for {down:.1f}s (last error: {self._reason})"
                )
            self._probing = True
            self._next_probe = now + self._interval
            return True

    def now(self) -> float:
        return self._clock()

    def succeeded(self, started: float) -> None:
        """A call that began at ``started`` (``now()``) got its answer. Only a
        call begun after the breaker opened proves the database is back: one
        that was already running when another failed proves nothing."""
        if self._open_since is None and not self._probing:
            return
        with self._lock:
            if self._open_since is not None and started < self._open_since:
                return
            if self._open_since is not None:
                log.warning("database back after %.1fs", self._clock() - self._open_since)
                metrics.breaker_closed()
            self._open_since = None
            self._probing = False

    def failed(self, reason: str) -> None:
        with self._lock:
            now = self._clock()
            if self._open_since is None:
                log.warning("database unavailable, failing fast: %s", reason)
                self._open_since = now
                metrics.breaker_opened()
            self._next_probe = now + self._interval
            self._probing = False
            self._reason = reason
