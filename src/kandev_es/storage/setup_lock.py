"""One schema setup at a time per store, whatever number of processes run
``kandev-es db init`` (or ``serve``'s first step) at once.

Two sessions running the same DDL together fail on PostgreSQL ("tuple
concurrently updated" when both replace a function or both create a table of
one name), so every setup holds a lock for its whole run and a second one waits,
then finds everything there and changes nothing.

PostgreSQL: a session-level ``pg_advisory_lock`` on a connection of its own, keyed
by the schema (``?schema=NAME``), so stores sharing a database set up in
parallel. The session's end releases it, so a killed ``db init`` frees it at once.

SQLite: an exclusive ``flock`` on a file beside the database, released by the
OS when the process ends.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kandev_es.config import PostgresTarget

# pg_advisory_lock(int4, int4): the first key names the lock's purpose, the
# second the schema. Apart from the one-bigint keys saves take (event_sql.py).
SETUP_LOCK_CLASS = int.from_bytes(b"kesi", "big")


def advisory_key(lock_class: int, schema: str | None) -> tuple[int, int]:
    """A two-int4 advisory lock key (pg_locks: classid, objid) for ``schema``."""
    digest = hashlib.sha256((schema or "").encode()).digest()
    return lock_class, int.from_bytes(digest[:4], "big") >> 1  # a non-negative int4


def setup_lock_path(database_path: Path) -> Path:
    return database_path.with_name(database_path.name + ".setup-lock")


@contextmanager
def postgres_setup_lock(target: PostgresTarget) -> Iterator[None]:
    import psycopg

    connection = psycopg.connect(
        target.conninfo, autocommit=True, application_name=f"kandev-es-db-init-{os.getpid()}"
    )
    try:
        connection.execute(
            "SELECT pg_advisory_lock(%s, %s)", advisory_key(SETUP_LOCK_CLASS, target.schema)
        )
        yield
    finally:
        connection.close()  # the session's end releases the lock


@contextmanager
def sqlite_setup_lock(database_path: Path) -> Iterator[None]:
    database_path.parent.mkdir(parents=True, exist_ok=True)
    with setup_lock_path(database_path).open("a+b") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        yield  # closing the file releases the lock
