"""How fast the connection pools reconnect after the database comes back.

psycopg_pool waits 1 s, then 2, 4, 8 … between reconnection attempts while the
database is down, so after a restart the service kept answering 503 for
seconds after the database was back. A constant half second costs one refused
connection attempt per pool per half second during an outage. psycopg_pool has
no option for it; tests/unit/test_library_internals.py checks the class
attributes still exist."""

from __future__ import annotations

from psycopg_pool.base import AttemptWithBackoff

RECONNECT_EVERY_S = 0.5


def reconnect_quickly() -> None:
    # Class attributes the pool reads for every attempt; setting them twice is harmless.
    AttemptWithBackoff.INITIAL_DELAY = RECONNECT_EVERY_S
    AttemptWithBackoff.DELAY_BACKOFF = 1.0
