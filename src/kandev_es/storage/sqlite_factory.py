"""The SQLite persistence factory for the embedded default: one writer, but a
Found never waits for it.

The library's connection pool queues every caller, reader or writer, on one
semaphore, and a writer holds that semaphore while it waits for the writer
lock; under a same-ID storm the Founds queued behind those writers and the
writers gave up after 5 s ("Timed out waiting for return of writer"). Here a
writer first queues on its own gate (up to WRITER_WAIT seconds) and joins the
shared queue only when no other writer holds a connection, so a reader's wait
is at most one connection hand-out. WAL mode lets readers read while the
writer writes. The pool holds enough connections for every request thread.

A writer's transaction begins IMMEDIATE (``ImmediateConnection``): the
library's plain BEGIN defers the lock to the first write, and a transaction
that read first (the library's tracking-table check, our chain-column check,
any later read-then-write) fails at once with "database is locked", with no
busy wait, when another process commits between its read and its write.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from threading import Lock
from time import monotonic
from typing import Any

from eventsourcing.persistence import ConnectionUnavailableError, OperationalError
from eventsourcing.sqlite import (
    SQLiteConnection,
    SQLiteConnectionPool,
    SQLiteCursor,
    SQLiteDatastore,
    SQLiteFactory,
    SQLiteTransaction,
)

# How long a save waits for the single writer before 503 store_unavailable.
WRITER_WAIT = 60
# Connections kept and allowed; above serve's request and stream threads.
POOL_SIZE = 16
MAX_OVERFLOW = 112


class ImmediateTransaction(SQLiteTransaction):
    """The library's transaction, but one that commits takes the write lock
    at BEGIN (waiting up to the busy timeout for another process's writer)."""

    def __enter__(self) -> SQLiteCursor:
        cursor = self.connection.cursor()
        try:
            cursor.execute("BEGIN IMMEDIATE" if self.commit else "BEGIN")
        except sqlite3.OperationalError as error:  # the lock's wait ran out
            raise OperationalError(error) from error
        return cursor


class ImmediateConnection(SQLiteConnection):
    @contextmanager
    def transaction(self, *, commit: bool) -> Iterator[SQLiteCursor]:
        with ImmediateTransaction(self, commit=commit) as curs, curs:
            yield curs


class WriterGatedPool(SQLiteConnectionPool):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._writer_gate = Lock()

    def _create_connection(self) -> SQLiteConnection:
        made = super()._create_connection()
        # The library's connection, set up as it sets it up (WAL, row factory,
        # its max-age timer), with the one method ImmediateConnection changes.
        made.__class__ = ImmediateConnection
        return made

    def get_connection(
        self, timeout: float | None = None, *, is_writer: bool | None = None
    ) -> SQLiteConnection:
        if is_writer is not True:
            return super().get_connection(timeout, is_writer=is_writer)
        started = monotonic()
        wait = float(WRITER_WAIT) if timeout is None else timeout
        if not self._writer_gate.acquire(timeout=wait):
            raise ConnectionUnavailableError("Timed out waiting for return of writer")
        try:
            remaining = max(wait - (monotonic() - started), 0.001)
            return super().get_connection(remaining, is_writer=True)
        except BaseException:
            self._writer_gate.release()
            raise

    def put_connection(self, conn: SQLiteConnection) -> None:
        was_writer = conn.is_writer is True
        try:
            super().put_connection(conn)
        finally:
            if was_writer:
                self._writer_gate.release()


class KandevSQLiteFactory(SQLiteFactory):
    def __init__(self, env: Any) -> None:
        super().__init__(env)
        library = self.datastore
        datastore = SQLiteDatastore(
            db_name=library.pool.db_name,
            single_row_tracking=library.single_row_tracking,
            originator_id_type=library.originator_id_type,
        )
        datastore.pool = WriterGatedPool(
            db_name=library.pool.db_name,
            lock_timeout=WRITER_WAIT,
            pool_size=POOL_SIZE,
            max_overflow=MAX_OVERFLOW,
            pool_timeout=float(WRITER_WAIT),
        )
        library.pool.close()
        self.datastore = datastore


SQLITE_FACTORY_TOPIC = f"{__name__}:{KandevSQLiteFactory.__name__}"
