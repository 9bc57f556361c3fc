"""SQLite's write transactions survive other processes' commits.

In WAL mode a transaction that read before it writes cannot wait for the
write lock: when another connection committed in between, SQLite answers
"database is locked" at once, whatever the busy timeout. The event store's
writer transactions therefore take the lock at BEGIN (storage/sqlite_factory.py):
here a second connection tries to commit before every statement a save runs,
and the save must still succeed. CI once saw the first save of a fresh process
fail this way (its chain-column check read first)."""

from __future__ import annotations

import sqlite3
import uuid
from typing import Any

import pytest
from eventsourcing.persistence import StoredEvent
from eventsourcing.sqlite import SQLiteConnection, SQLiteDatastore

from kandev_es.storage.sqlite_factory import WriterGatedPool
from kandev_es.storage.sqlite_recorder import KandevSQLiteRecorder

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


class InterleavingPool(WriterGatedPool):
    """Connections that let ``other`` try a commit before each statement."""

    def __init__(self, other: sqlite3.Connection, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.other = other
        self.tried = self.refused = 0

    def _create_connection(self) -> SQLiteConnection:
        made = super()._create_connection()
        made._sqlite_conn.set_trace_callback(self._interleave)
        return made

    def _interleave(self, statement: str) -> None:
        if statement.upper().startswith(("BEGIN", "COMMIT", "ROLLBACK")):
            return
        self.tried += 1
        try:
            self.other.execute("INSERT INTO interleaved (at) VALUES (?)", (statement[:40],))
        except sqlite3.OperationalError:
            self.refused += 1  # the save holds the write lock: nothing came between


def event(stream: uuid.UUID, version: int) -> StoredEvent:
    return StoredEvent(originator_id=stream, originator_version=version,
                       topic="kandev_es.test:Interleaved", state=b"{}")


def test_a_fresh_processs_first_save_survives_a_commit_between_its_statements(services):
    db_name = services.app.recorder.datastore.pool.db_name
    other = sqlite3.connect(db_name, uri=True, timeout=0, isolation_level=None)
    other.execute("CREATE TABLE interleaved (at TEXT)")
    pool = InterleavingPool(other, db_name=db_name, lock_timeout=5, pool_size=2,
                            max_overflow=2, pool_timeout=5.0)
    datastore = SQLiteDatastore(db_name=db_name)
    datastore.pool.close()
    datastore.pool = pool
    # A recorder as a fresh process has it: it has not yet looked for the chain column.
    recorder = KandevSQLiteRecorder(datastore,
                                    events_table_name=services.app.recorder.events_table_name)
    stream = uuid.uuid4()
    try:
        assert recorder.insert_events([event(stream, 1)])
        assert recorder.insert_events([event(stream, 2), event(stream, 3)])
    finally:
        pool.close()
        other.close()
    assert pool.tried and pool.refused == pool.tried
    assert [e.originator_version for e in services.app.recorder.select_events(stream)] == [1, 2, 3]


def test_a_writer_transaction_holds_the_write_lock_from_its_begin(services):
    datastore = services.app.recorder.datastore
    other = sqlite3.connect(datastore.pool.db_name, uri=True, timeout=0, isolation_level=None)
    try:
        with datastore.transaction(commit=True), pytest.raises(sqlite3.OperationalError,
                                                               match="locked"):
            other.execute("BEGIN IMMEDIATE")
        other.execute("BEGIN IMMEDIATE")  # released at its end
        other.execute("ROLLBACK")
    finally:
        other.close()
