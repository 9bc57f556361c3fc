"""Hand out the most recently returned pooled connection first (LIFO).

psycopg_pool rotates through every idle connection (FIFO), so consecutive
calls from one thread land on different PostgreSQL backends whose caches have
gone cold; measured here, a Found's query cost a third more through the pool
than on one held connection. LIFO keeps the busy connections hot and lets the
ones a burst opened go idle and be closed after ``max_idle`` (SQLAlchemy's
``pool_use_lifo``, for the same reasons). psycopg_pool has no option for it, so
the one method that picks a ready connection is overridden. The names it uses
are pinned in setup.cfg and checked by tests/unit/test_library_internals.py."""

from __future__ import annotations

from typing import Any

from psycopg_pool import ConnectionPool, PoolTimeout

from kandev_es import metrics

_LIFO_CLASSES: dict[type, type] = {}


def _lifo_subclass(base: type[ConnectionPool[Any]]) -> type[ConnectionPool[Any]]:
    pick_ready = base._get_ready_connection

    def _get_ready_connection(self: Any, timeout: float | None) -> Any:
        if timeout is not None and timeout <= 0.0:
            raise PoolTimeout()
        if self._pool:
            conn = self._pool.pop()  # the right end is where putconn appends
            if len(self._pool) < self._nconns_min:
                self._nconns_min = len(self._pool)  # what the idle shrinker reads
            return conn
        # None ready: the base class decides between waiting and refusing.
        conn = pick_ready(self, timeout)
        if conn is None:  # the caller waits: counted (docs/observability.md: Alerts)
            metrics.record_pool_wait()
        return conn

    # Same layout as the base (one method more), so a live pool can switch.
    return type(f"MostRecentFirst{base.__name__}", (base,), {
        "_get_ready_connection": _get_ready_connection,
        "most_recent_first": True,
    })


def serve_most_recent_first(pool: ConnectionPool[Any]) -> None:
    """Switch a pool built elsewhere (the event store's) to LIFO."""
    base = type(pool)
    if getattr(base, "most_recent_first", False):
        return
    lifo = _LIFO_CLASSES.get(base)
    if lifo is None:
        lifo = _LIFO_CLASSES[base] = _lifo_subclass(base)
    pool.__class__ = lifo
