"""Which process runs the background projection loop: one per database.

Every web worker (and any ``kandev-es projections run``) starts the loop, but
only the holder of a lock does passes; the others retry the lock every
``RETRY_SECONDS``, so a dead leader is replaced within about that long. Explicit
calls (``catch_up``, ``run_once``, rebuilds) never ask: the tracking row's lock
already keeps two processes from applying an event twice. The lock is only about
not doing the same idle passes N times.

PostgreSQL: a session-level ``pg_try_advisory_lock`` on a connection of its own
(not from the pool: a pool reset must not drop it). PostgreSQL releases it when
that session ends, so a killed process frees it at once; a leader that finds its
connection broken has lost the lock and goes back to trying.

SQLite: an exclusive non-blocking ``flock`` on a file beside the database
(released by the OS when the process dies); the holder's pid is written in it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from pathlib import Path
from typing import IO, Any, Protocol

from kandev_es.storage.database import Database, PostgresDatabase, SQLiteDatabase
from kandev_es.storage.setup_lock import advisory_key

log = logging.getLogger("kandev_es.projections")
RETRY_SECONDS = 1.0
# pg_try_advisory_lock(int4, int4): the first key says "kandev-es projection
# leader" (b"kes1"), the second names the schema, so databases sharing a cluster
# and schemas sharing a database each get their own leader. The two-key form is
# apart from the one-bigint keys saves take (storage/event_sql.py).
LOCK_CLASS = int.from_bytes(b"kes1", "big")


class Leadership(Protocol):
    def hold(self) -> bool:
        """Whether this process leads now; takes the lead when it is free."""
        ...

    def release(self) -> None: ...


def lock_key(schema: str | None) -> tuple[int, int]:
    """The advisory lock of the leader for ``schema`` (pg_locks: classid, objid)."""
    return advisory_key(LOCK_CLASS, schema)


def lock_path(database_path: Path) -> Path:
    """The file whose ``flock`` the leader for this SQLite database holds."""
    return database_path.with_name(database_path.name + ".projection-leader")


class PostgresLeadership:
    """The advisory lock on a dedicated autocommit connection. A leader checks
    its session is still there at most every ``check_seconds``; a follower asks
    for the lock again on the same connection."""

    def __init__(self, url: str, schema: str | None, check_seconds: float = RETRY_SECONDS):
        self._url = url
        self._key = lock_key(schema)
        self._check_seconds = check_seconds
        self._connection: Any = None
        self._held = False
        self._checked = 0.0
        self._unreachable = False

    def hold(self) -> bool:
        now = time.monotonic()
        if self._held and now < self._checked + self._check_seconds:
            return True
        try:
            if self._connection is None:
                self._connection = self._connect()
            if self._held:
                self._connection.execute("SELECT 1")
            else:
                row = self._connection.execute(
                    "SELECT pg_try_advisory_lock(%s, %s)", self._key
                ).fetchone()
                self._held = bool(row[0])
        except Exception as error:  # a killed session, a restart: the lock is gone with it
            if self._held or not self._unreachable:
                log.warning("projection leader lock unavailable (%s); retrying", error)
            self._unreachable = True
            self._drop()
            return False
        self._unreachable = False
        self._checked = now
        return self._held

    def _connect(self) -> Any:
        import psycopg

        # The service's one conninfo (connect_timeout included): the lock is
        # taken on the same server the stores write to.
        return psycopg.connect(
            self._url,
            autocommit=True,
            application_name=f"kandev-es-projection-leader-{os.getpid()}",
        )

    def _drop(self) -> None:
        connection, self._connection, self._held = self._connection, None, False
        if connection is not None:
            with contextlib.suppress(Exception):  # closing a dead connection
                connection.close()

    def release(self) -> None:
        self._drop()  # the session's end releases the lock


class FileLeadership:
    """``flock`` on ``path``: held while the file stays open in this process."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._file: IO[bytes] | None = None
        self._warned = False

    def hold(self) -> bool:
        if self._file is not None:
            return True
        try:
            file = self._path.open("a+b")
        except OSError as error:  # the data dir is gone or read-only: nobody leads here
            if not self._warned:
                log.warning("projection leader lock file unavailable (%s)", error)
            self._warned = True
            return False
        self._warned = False
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another process holds it
            file.close()
            return False
        file.truncate(0)
        file.write(f"{os.getpid()}\n".encode())
        file.flush()
        self._file = file
        return True

    def release(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.close()  # closing the last descriptor releases the lock


def make_leadership(
    database: Database, role: str = "projection", lock_class: int = LOCK_CLASS
) -> Leadership:
    """The lead of one kind of background work (``role``) over ``database``:
    the projection loop's, or another leader's with a lock of its own
    (``lock_class`` on PostgreSQL, a ``.ROLE-leader`` file beside SQLite's)."""
    if isinstance(database, PostgresDatabase):
        held = PostgresLeadership(database.conninfo, database.schema)
        held._key = advisory_key(lock_class, database.schema)
        return held
    if isinstance(database, SQLiteDatabase):
        path = lock_path(database.path)
        return FileLeadership(path.with_name(path.name.replace("projection", role)))
    raise TypeError(f"no {role} leadership for {type(database).__name__}")
