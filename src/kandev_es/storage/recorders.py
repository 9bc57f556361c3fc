"""The PostgreSQL event store recorder, with what the create protocol needs
beyond the library's (the SQLite one is ``sqlite_recorder``; this module is
imported only when the database URL is PostgreSQL, psycopg being an extra):

- **fail fast** (PostgreSQL): the library retries every call ten times, each
  waiting up to the pool timeout, so a request against a stopped database hung
  for about fifty seconds. Here a failed call is retried once, after the pool
  has dropped its broken connections (a restart kills them all at once); a
  second failure is final and the caller answers 503 (``StoreBreaker`` answers
  the calls after it at once). A failover's errors (a standby's read-only
  refusal, a node shutting down: ``breaker.means_node_lost``) drain the whole
  pool first, so no connection to the old node is used again.
- **several streams in one query** (``select_streams``): the events after a
  given version of each of several aggregates, so a retry's Found costs one
  round trip instead of one per aggregate.
- **a guarded save** (``insert_events(..., unchanged={id: version})``): the
  events are written only if none of the named streams has moved past the
  version the caller read, checked inside the write transaction while it
  holds those streams' locks (below). Otherwise nothing is written and
  ``StreamsAdvanced`` is raised.
- **no global write lock**: a save locks only its own streams (exclusive) and
  its guard streams (shared), so saves of different streams commit in
  parallel; readers of the notification log read only what is settled
  (``settled.py``, docs/architecture.md "Ordering without a global lock").
- **the office counter** (``next_office_number``) on the same connections, one
  statement, so a create does not need a second pool for it."""

from __future__ import annotations

import functools
import struct
import time
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import psycopg
from eventsourcing import persistence
from eventsourcing.persistence import InterfaceError, OperationalError, StoredEvent
from eventsourcing.postgres import (
    PostgresAggregateRecorder,
    PostgresApplicationRecorder,
    PostgresFactory,
)
from psycopg.adapt import Buffer, Dumper
from psycopg.pq import Format
from psycopg.rows import dict_row, tuple_row
from psycopg.sql import SQL, Identifier
from psycopg_pool import PoolTimeout

from kandev_es.storage.breaker import means_node_lost, means_read_only
from kandev_es.storage.chains import known_chain_hashes
from kandev_es.storage.counters import sequence_name
from kandev_es.storage.event_sql import (
    chain_column_statement,
    drop_old_insert_function,
    insert_function,
    upgrade_statement,
)
from kandev_es.storage.notifier import SAVES, SaveNotifier
from kandev_es.storage.pools import serve_most_recent_first
from kandev_es.storage.settled import Followed, Horizon, Settled, Writers
from kandev_es.storage.streams import Since, StreamsAdvanced, Versions
from kandev_es.storage.view_writes import APPLY_VIEWS, ViewsFailed, postgres_function, views_json

F = TypeVar("F", bound=Callable[..., Any])
FAST_FAILURE_S = 0.25
SETTLE_WAIT_S = 1.0
# Above this many streams a read is one LATERAL join over unnest() (a batch's
# window), not one UNION ALL branch per stream (_streams_statement).
MANY_STREAMS = 16
SET_READ_COMMITTED = "SET default_transaction_isolation = 'read committed'"


def _unretried(method: Any) -> Any:
    # eventsourcing's retry decorator keeps the plain method in __wrapped__
    # (functools.wraps); tests/unit/test_library_internals.py checks it.
    return getattr(method, "__wrapped__", method)


def _may_retry(recorder: Any, error: Exception, started: float) -> bool:
    """Whether a call that failed with ``error`` may be made once more: only
    what a restart or a failover leaves behind (a pooled connection that failed
    at once). Cleans the pool first. A pool timeout or a slow failure means the
    database is unreachable, and waiting again would only double the wait."""
    lost = means_node_lost(error)
    if lost:
        # A standby's read-only refusal or a node going away (a failover):
        # none of the pool's connections to that node is reused; new ones
        # find the primary through the URL.
        recorder.datastore.pool.drain()
    if isinstance(error.__cause__, PoolTimeout) or (
        time.monotonic() - started > FAST_FAILURE_S
    ):
        return False
    if not lost:
        recorder.datastore.pool.check()  # drop dead connections, start new ones
    return True


def _connection_error(error: Exception) -> bool:
    """The connection's fault, not the query's (an InternalError only when it
    is a failover's: a standby's read-only refusal, a node shutting down)."""
    return not isinstance(error, persistence.InternalError) or means_node_lost(error)


def _retry_once_after_pool_check(method: F) -> F:
    @functools.wraps(method)
    def call(self: PostgresApplicationRecorder, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return method(self, *args, **kwargs)
        except (InterfaceError, OperationalError, persistence.InternalError) as error:
            if not _connection_error(error) or not _may_retry(self, error, started):
                raise
            return method(self, *args, **kwargs)

    return call  # type: ignore[return-value]


def _save_retried_knowingly(method: F) -> F:
    """A save is never retried blind: its connection may have failed after
    the commit, with only the answer lost. So after a connection error the
    store is asked first whether the events are there (``committed``): if so,
    the save succeeded and its notification ids are returned; if not, it is
    retried once (as any call); if the store cannot say, the error stands
    (503: the caller cannot know either, and must not be told it failed)."""

    @functools.wraps(method)
    def call(self: KandevPostgresRecorder, stored: Sequence[StoredEvent], **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return method(self, stored, **kwargs)
        except (InterfaceError, OperationalError, persistence.InternalError) as error:
            if not _connection_error(error):
                raise
            may_retry = _may_retry(self, error, started)
            # A read-only refusal (a standby's) wrote nothing: nothing to ask.
            if isinstance(error.__cause__, PoolTimeout) or means_read_only(error):
                ids = None
            else:
                try:
                    ids = self.committed(stored)
                except (InterfaceError, OperationalError, persistence.InternalError):
                    raise error from None
            if ids is not None:
                self.notifier.saved()
                return ids
            if not may_retry:
                raise
            return method(self, stored, **kwargs)

    return call  # type: ignore[return-value]


# A save's four event arrays (and two guard arrays), packed straight into
# PostgreSQL's binary array format: psycopg's generic list dumper finds the
# element type and calls a Python dumper per element, a fifth of a Created's
# Python calls. Same bytes, same parameter types (uuid[], bigint[], text[],
# bytea[]); tests/unit/test_packed_arrays.py compares with psycopg's own.
_HEAD = struct.Struct("!iIIii")  # dimensions, has-null, element oid, length, lower bound
_EMPTY = struct.Struct("!iII")
_LENGTH = struct.Struct("!i")
_INT8 = struct.Struct("!iq")  # length 8, value
_UUID_LENGTH = _LENGTH.pack(16)
UUID_OID, INT8_OID, TEXT_OID, BYTEA_OID = 2950, 20, 25, 17


class _Packed(bytes):
    """One array parameter already in binary wire format."""


class _UuidArray(_Packed):
    pass


class _Int8Array(_Packed):
    pass


class _TextArray(_Packed):
    pass


class _ByteaArray(_Packed):
    pass


def _register_packed(cls: type[_Packed], array_oid: int) -> None:
    class PackedDumper(Dumper):
        format = Format.BINARY
        oid = array_oid

        def dump(self, obj: Any) -> Buffer | None:
            return bytes(obj)

    # Registered globally: only these private types are affected.
    psycopg.adapters.register_dumper(cls, PackedDumper)


_register_packed(_UuidArray, 2951)
_register_packed(_Int8Array, 1016)
_register_packed(_TextArray, 1009)
_register_packed(_ByteaArray, 1001)


def _head(element_oid: int, count: int, has_null: int = 0) -> bytes:
    if not count:
        return _EMPTY.pack(0, 0, element_oid)
    return _HEAD.pack(1, has_null, element_oid, count, 1)


def pack_uuids(values: Sequence[uuid.UUID | str]) -> _UuidArray:
    return _UuidArray(
        _head(UUID_OID, len(values))
        + b"".join(
            [
                _UUID_LENGTH + (value if isinstance(value, uuid.UUID) else uuid.UUID(value)).bytes
                for value in values
            ]
        )
    )


def pack_int8s(values: Sequence[int]) -> _Int8Array:
    return _Int8Array(
        _head(INT8_OID, len(values)) + b"".join([_INT8.pack(8, value) for value in values])
    )


def pack_texts(values: Sequence[str], encoding: str) -> _TextArray:
    # psycopg's own text dumper sends SQL_ASCII ("ascii") connections UTF-8.
    encoding = encoding if encoding != "ascii" else "utf-8"
    encoded = [value.encode(encoding) for value in values]
    return _TextArray(
        _head(TEXT_OID, len(values))
        + b"".join([_LENGTH.pack(len(value)) + value for value in encoded])
    )


def pack_byteas(values: Sequence[bytes]) -> _ByteaArray:
    return _ByteaArray(
        _head(BYTEA_OID, len(values))
        + b"".join([_LENGTH.pack(len(value)) + value for value in values])
    )


_NULL = _LENGTH.pack(-1)


def pack_chain_hashes(values: Sequence[bytes | None] | None) -> _ByteaArray | None:
    """The save's chain hashes (storage/chains.py), None elements as SQL NULLs
    (filled in the save's statement); None: the statement computes them all."""
    if values is None:
        return None
    has_null = int(None in values)
    return _ByteaArray(
        _head(BYTEA_OID, len(values), has_null)
        + b"".join([_NULL if value is None else _LENGTH.pack(len(value)) + value
                    for value in values])
    )


# psycopg's errors as the library's datastore.get_connection maps them, most
# specific first (tests/unit/test_library_internals.py compares with its code).
LIBRARY_ERRORS: tuple[tuple[type[psycopg.Error], type[persistence.PersistenceError]], ...] = (
    (psycopg.InterfaceError, persistence.InterfaceError),
    (psycopg.OperationalError, persistence.OperationalError),
    (psycopg.DataError, persistence.DataError),
    (psycopg.IntegrityError, persistence.IntegrityError),
    (psycopg.InternalError, persistence.InternalError),
    (psycopg.ProgrammingError, persistence.ProgrammingError),
    (psycopg.NotSupportedError, persistence.NotSupportedError),
    (psycopg.DatabaseError, persistence.DatabaseError),
    (psycopg.Error, persistence.PersistenceError),
)


def library_error(error: psycopg.Error) -> persistence.PersistenceError:
    for raised, mapped in LIBRARY_ERRORS:
        if isinstance(error, raised):
            return mapped(str(error))
    raise AssertionError("psycopg.Error is the last row")  # pragma: no cover


class _Pooled:
    """A pooled connection for one call, as the library's
    ``datastore.get_connection`` gives it (the same errors, the connection
    back to the pool however the call ends), without its three generator
    context managers, logging and no-op commit of an autocommit connection
    per call: a fifth of a save's Python calls. Only for statements that need
    no composite type adapters (the library registers those in its wrapper)."""

    __slots__ = ("_conn", "_pool")

    def __init__(self, pool: Any) -> None:
        self._pool = pool

    def __enter__(self) -> psycopg.Connection[Any]:
        pool = self._pool
        try:
            if pool.closed:
                pool.open(wait=True, timeout=30.0)
            self._conn = pool.getconn()
        except psycopg.Error as error:
            raise library_error(error) from error
        return self._conn  # type: ignore[no-any-return]

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # The pool rolls back or discards a connection not left idle.
        self._pool.putconn(self._conn)
        if isinstance(error, psycopg.Error):
            raise library_error(error) from error


def _stored_events(rows: Sequence[tuple[Any, ...]]) -> list[StoredEvent]:
    """Rows of (originator_id, originator_version, topic, state) as stored events."""
    return [
        StoredEvent(
            originator_id=originator_id,
            originator_version=originator_version,
            topic=topic,
            state=bytes(state),
        )
        for originator_id, originator_version, topic, state in rows
    ]


def _tuples(conn: psycopg.Connection[Any]) -> psycopg.Cursor[tuple[Any, ...]]:
    """A cursor yielding plain tuples: the pool's dict rows rebuild the column
    names for every row, a quarter of a Found's query time."""
    return psycopg.Cursor(conn, row_factory=tuple_row)


class KandevPostgresRecorder(PostgresApplicationRecorder):
    # Off (KANDEV_LEDGER_SAVE_CHAINS, set by application.Tasks): the save writes
    # no chain hash and only the sequencer's log chains the events.
    save_chains = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        serve_most_recent_first(self.datastore.pool)
        schema = Identifier(self.datastore.schema)
        table = SQL("{0}.{1}").format(schema, Identifier(self.events_table_name))
        self._table_sql = table.as_string(None)
        self.events_table_sql = self._table_sql  # for a rebuild's switch (projections/rebuild.py)
        self._select_streams_sql: dict[int, str] = {}
        self._drawing_sql: dict[str, str] = {}
        self._many_streams_sql = (
            "SELECT e.originator_id, e.originator_version, e.topic, e.state"
            " FROM unnest(%b::uuid[], %b::int8[]) AS s (id, since) CROSS JOIN LATERAL"
            f" (SELECT originator_id, originator_version, topic, state FROM {self._table_sql}"
            "  WHERE originator_id = s.id AND originator_version > s.since) AS e"
            " ORDER BY originator_id, originator_version"
        )
        self._read_committed: weakref.WeakSet[Any] = weakref.WeakSet()
        self.horizon = Horizon(self._table_sql)
        self.writers = Writers(self._table_sql)
        # Named columns, not the library's SELECT *: a prepared SELECT * fails
        # ("cached plan must not change result type") once a column is added.
        self.select_events_statement = SQL(
            "SELECT originator_id, originator_version, topic, state FROM {0}"
            " WHERE originator_id = %s"
        ).format(table)
        self.sql_create_statements.append(upgrade_statement(table, self._table_sql))
        self.sql_create_statements.append(chain_column_statement(table, self._table_sql))
        # One statement, one transaction per save instead of the library's
        # pipelined BEGIN, SET, LOCK, NOTIFY, INSERT, COMMIT: a function that
        # takes the streams' locks (sorted, so two saves never deadlock),
        # checks the guard and inserts (event_sql.py), run on an autocommit
        # session. No table lock: readers cope with ids committing out of
        # order (settled.py). The NOTIFY that wakes projection runners goes
        # out after the commit, coalesced per process (notifier.py). Plain
        # arrays, not the composite type, sent in binary (%b): the text form of
        # a bytea array cost more to escape and parse than the insert itself.
        # The inline projections' rows go in the same statement, as JSON
        # (storage/view_writes.py), written by a function of their own.
        schema_sql = schema.as_string(None)
        apply_views = SQL("{0}.{1}").format(schema, Identifier(APPLY_VIEWS))
        self.sql_create_statements.append(
            SQL(postgres_function(apply_views.as_string(None), schema_sql))  # type: ignore[arg-type]
        )
        function = SQL("{0}.kandev_insert_events").format(schema)
        self.sql_create_statements.append(drop_old_insert_function(function))
        self.sql_create_statements.append(insert_function(function, table, apply_views))
        self._insert_sql = SQL(
            "SELECT {0}(%b::uuid[], %b::bigint[], %b::text[], %b::bytea[],"
            " %b::uuid[], %b::bigint[], %s::jsonb, %b::bytea[], %s::boolean)"
        ).format(function).as_string(None)
        self._notify_sql = SQL("NOTIFY {0}").format(Identifier(self.channel_name)).as_string(None)
        self.notifier = SaveNotifier(self._notify)
        quoted_schema = '"' + self.datastore.schema.replace('"', '""') + '"'
        self._sequence_prefix = quoted_schema + "."
        self._task_keys_sql = SQL(
            "SELECT task_id, data_key FROM {0}.task_keys WHERE task_id = ANY(%b::uuid[])"
        ).format(schema).as_string(None)

    @_save_retried_knowingly
    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        if not stored_events:
            return []
        unchanged: Versions = kwargs.get("unchanged") or {}
        with _Pooled(self.datastore.pool) as conn:
            if conn not in self._read_committed:
                # The guard must see what committed while the save waited for
                # its locks, so READ COMMITTED whatever the server's default
                # (event_sql.insert_function refuses any other level).
                conn.execute(SET_READ_COMMITTED)
                self._read_committed.add(conn)
            params = (
                pack_uuids([e.originator_id for e in stored_events]),
                pack_int8s([e.originator_version for e in stored_events]),
                pack_texts([e.topic for e in stored_events], conn.info.encoding),
                pack_byteas([e.state for e in stored_events]),
                pack_uuids(list(unchanged)),
                pack_int8s(list(unchanged.values())),
                views_json(kwargs.get("views")),
                pack_chain_hashes(known_chain_hashes(stored_events) if self.save_chains
                                  else None),
                self.save_chains,
            )
            try:
                rows = _tuples(conn).execute(self._insert_sql, params, prepare=True).fetchall()
            except psycopg.Error as error:
                # Autocommit: the statement's transaction is rolled back whole.
                # A node lost or gone read-only inside the views' function (a
                # failover) is an outage like any other, not a refusing view.
                if APPLY_VIEWS in (error.diag.context or "") and not means_node_lost(error):
                    raise ViewsFailed(f"a read model refused the save: {error}") from None
                raise
        if not rows:
            raise StreamsAdvanced("a stream this save depends on has moved on")
        self.notifier.saved()
        SAVES.ring()
        return [row[0] for row in rows]

    def _notify(self) -> None:
        with _Pooled(self.datastore.pool) as conn:
            conn.execute(self._notify_sql)

    def committed(self, stored: Sequence[StoredEvent]) -> list[int] | None:
        """The notification ids of ``stored`` if that save committed, None if
        it did not. A save is one transaction: its events are all there or
        none is. Another writer's events at the same versions (their bytes
        differ: timestamps, contents) mean ours lost the version check."""
        statement = (
            f"SELECT originator_id, originator_version, topic, state, notification_id"
            f" FROM {self._table_sql} WHERE (originator_id, originator_version) IN"
            " (SELECT * FROM unnest(%b::uuid[], %b::bigint[]))"
        )
        params = (
            pack_uuids([e.originator_id for e in stored]),
            pack_int8s([e.originator_version for e in stored]),
        )
        with _Pooled(self.datastore.pool) as conn:
            rows = _tuples(conn).execute(statement, params).fetchall()
        found = {(uuid.UUID(str(r[0])), int(r[1])): r for r in rows}
        ids = []
        for event in stored:
            row = found.get((uuid.UUID(str(event.originator_id)), event.originator_version))
            if row is None or row[2] != event.topic or bytes(row[3]) != event.state:
                if rows:
                    raise persistence.IntegrityError("another writer took these versions")
                return None
            ids.append(int(row[4]))
        return ids

    @_retry_once_after_pool_check
    def checkpoint(self) -> int:
        """Record a checkpoint if the log has grown; return the visible head."""
        with _Pooled(self.datastore.pool) as conn:
            row = _tuples(conn).execute(
                self.horizon.checkpoint_sql, (self.horizon.known(),), prepare=True
            ).fetchone()
        assert row is not None
        head, xid = int(row[0]), row[1]
        if xid is not None:
            self.horizon.add(head, int(xid))
        return head

    @_retry_once_after_pool_check
    def settled_rows(
        self, query: str, params: dict[str, Any], wait: float = SETTLE_WAIT_S
    ) -> list[tuple[Any, ...]]:
        """The rows of ``query`` (``{schema}`` for this store's schema, its
        rows bounded by ``%(upto)s``) up to a position at or above every event
        committed before the call, all of whose events have committed: for
        readers of rows written inline (settled.py, ``Writers``). Waits up to
        ``wait`` for the saves under way to end; after that, reads up to the
        highest position settled so far."""
        with _Pooled(self.datastore.pool) as conn:
            row = _tuples(conn).execute(
                self.writers.head_sql, (self._table_sql,), prepare=True
            ).fetchone()
        assert row is not None
        head, writing = int(row[0]), list(row[1])
        statement = self.writers.settled_sql(query.format(schema=self._sequence_prefix[:-1]))
        deadline = time.monotonic() + wait
        pause = 0.0005
        while True:
            with _Pooled(self.datastore.pool) as conn:
                rows = _tuples(conn).execute(
                    statement, {**params, "upto": head, "writing": writing}, prepare=True
                ).fetchall()
            if rows[0][0]:
                self.horizon.raise_floor(head)
                return [found[1:] for found in rows if found[1] is not None]
            if time.monotonic() + pause > deadline:
                self.checkpoint()
                head, writing = self.read_settled(head, 0).position, []
                continue
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def following_rows(
        self, query: str, params: dict[str, Any], watched: Mapping[uuid.UUID, int]
    ) -> Followed:
        """For a reader following the log a moment behind (the feed reader):
        the rows of ``query`` (``{schema}``; bounded by ``b.bound``; its first
        column never null) up to the position the process's checkpoints have
        settled, that position, the log's head and whether any ``watched``
        aggregate has an event after the version given, in ONE statement
        (``Horizon.following_sql``). Lags the head by about one save's time
        while saves come, and by any transaction with an id anywhere in the
        cluster: the caller falls back to ``settled_rows`` when it stays
        behind."""
        statement = self.horizon.following_sql(query.format(schema=self._sequence_prefix[:-1]))
        with _Pooled(self.datastore.pool) as conn:
            rows = _tuples(conn).execute(
                statement, self.horizon.following_params(params, watched), prepare=True
            ).fetchall()
        return self.horizon.followed(rows)

    @_retry_once_after_pool_check
    def first_unknown(self, after: int, upto: int, known: Sequence[str]) -> tuple[int, str] | None:
        """The first notification in (after, upto] whose topic is not in ``known``."""
        with _Pooled(self.datastore.pool) as conn:
            row = _tuples(conn).execute(
                f"SELECT notification_id, topic FROM {self._table_sql}"
                " WHERE notification_id > %s AND notification_id <= %s"
                " AND NOT topic = ANY(%s) ORDER BY notification_id LIMIT 1",
                (after, upto, list(known)),
            ).fetchone()
        return None if row is None else (int(row[0]), str(row[1]))

    @_retry_once_after_pool_check
    def read_settled(self, after: int, limit: int, topics: Sequence[str] = ()) -> Settled:
        """Up to ``limit`` notifications after ``after``, only settled ones."""
        statement, params = self.horizon.read_params(after, limit, topics)
        with _Pooled(self.datastore.pool) as conn:
            rows = _tuples(conn).execute(statement, params, prepare=True).fetchall()
        return self.horizon.settle(rows)

    select_events = _retry_once_after_pool_check(
        _unretried(PostgresAggregateRecorder.select_events)
    )
    select_notifications = _retry_once_after_pool_check(
        _unretried(PostgresApplicationRecorder.select_notifications)
    )
    max_notification_id = _retry_once_after_pool_check(
        _unretried(PostgresApplicationRecorder.max_notification_id)
    )

    def _streams_query(self, since: Since) -> tuple[str, list[Any]]:
        """The statement reading ``since``'s streams, and its parameters."""
        if len(since) > MANY_STREAMS:
            keys = [key for key, _ in since]
            return self._many_streams_sql, [keys, [version for _, version in since]]
        params = [value for key, version in since for value in (key, version)]
        return self._streams_statement(len(since)), params

    def _streams_statement(self, count: int) -> str:
        # One primary-key range scan per stream, UNION ALL, prepared once per
        # arity: half the server CPU of the same ranges OR-ed into one WHERE
        # (a bitmap OR, recheck and sort); a join over unnest() cost four times more.
        # Up to MANY_STREAMS streams only: PostgreSQL plans every branch, each
        # time for a prepared statement's first five runs on a connection
        # (custom plans), so 500 branches cost 50-80 ms a read (a batch's
        # window) where one LATERAL join over unnest() costs about 4 ms.
        statement = self._select_streams_sql.get(count)
        if statement is None:
            one = (
                f"SELECT originator_id, originator_version, topic, state"
                f" FROM {self._table_sql} WHERE originator_id = %b AND originator_version > %b"
            )
            statement = " UNION ALL ".join([one] * count)
            statement += " ORDER BY originator_id, originator_version"
            self._select_streams_sql[count] = statement
        return statement

    @_retry_once_after_pool_check
    def select_task_keys(self, task_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, bytes]:
        """The stored data keys of those of ``task_ids`` that have one (storage/sealing.py)."""
        with _Pooled(self.datastore.pool) as conn:
            rows = _tuples(conn).execute(
                self._task_keys_sql, (pack_uuids(list(task_ids)),), prepare=True
            ).fetchall()
        return {uuid.UUID(str(row[0])): bytes.fromhex(row[1]) for row in rows}

    @_retry_once_after_pool_check
    def select_streams(self, since: Since) -> list[StoredEvent]:
        statement, params = self._streams_query(since)
        with _Pooled(self.datastore.pool) as conn:
            rows = _tuples(conn).execute(statement, params, prepare=True).fetchall()
        return _stored_events(rows)

    @_retry_once_after_pool_check
    def select_streams_drawing(
        self, since: Since, workspace_id: uuid.UUID
    ) -> tuple[list[StoredEvent], int | None]:
        """``select_streams``, and in the same statement the workspace's next
        office number when -- and only when -- the read returns no event at
        all: every stream is where the caller's cached snapshot left it and the
        rest (the identity) has none. The caller asks only when those snapshots
        already admit a first claim (creation/service.py), so a number is drawn
        only for a create that goes on to claim it: a create pays one round
        trip and one commit fewer, and a number is lost only where one already
        was (a concurrent claimer wins). A missing sequence draws nothing."""
        streams, params = self._streams_query(since)
        params.append(self._sequence(workspace_id))
        statement = self._drawing_statement(streams)
        with _Pooled(self.datastore.pool) as conn:
            rows = _tuples(conn).execute(statement, params, prepare=True).fetchall()
        # The draw's row sorts last (ORDER BY 1: a NULL originator_id) and only
        # exists when no event was read; its number is NULL without a sequence.
        if rows and rows[-1][0] is None:
            drawn = rows.pop()[1]
            return [], None if drawn is None else int(drawn)
        return _stored_events(rows), None

    def _drawing_statement(self, reading: str) -> str:
        """``reading`` (a _streams_query statement), drawing as it reads."""
        statement = self._drawing_sql.get(reading)
        if statement is None:
            # The draw is a one-row SELECT whose constant qual (no row in s)
            # is checked before its target list: nextval runs only then.
            streams = reading.rsplit(" ORDER BY ", 1)[0]
            statement = (
                f"WITH s AS MATERIALIZED ({streams})"
                " SELECT originator_id, originator_version, topic, state FROM s"
                " UNION ALL SELECT NULL, nextval(to_regclass(%b::text)), NULL, NULL"
                " WHERE NOT EXISTS (SELECT FROM s)"
                " ORDER BY 1, 2"
            )
            self._drawing_sql[reading] = statement
        return statement

    @_retry_once_after_pool_check
    def next_office_number(self, workspace_id: uuid.UUID) -> int:
        with _Pooled(self.datastore.pool) as conn:
            row = _tuples(conn).execute(
                "SELECT nextval(%b::regclass)", (self._sequence(workspace_id),), prepare=True
            ).fetchone()
        assert row is not None
        return int(row[0])

    @_retry_once_after_pool_check
    def next_office_numbers(self, workspace_id: uuid.UUID, count: int) -> list[int]:
        """``count`` office numbers in one statement (a batch of creates),
        ascending; another drawer's numbers may fall between them."""
        with _Pooled(self.datastore.pool) as conn:
            rows = _tuples(conn).execute(
                "SELECT nextval(%b::regclass) FROM generate_series(1, %b::int)",
                (self._sequence(workspace_id), count),
                prepare=True,
            ).fetchall()
        return sorted(int(row[0]) for row in rows)

    def _sequence(self, workspace_id: uuid.UUID) -> str:
        """The workspace's office number sequence, schema-qualified (storage/counters.py)."""
        return f'{self._sequence_prefix}"{sequence_name(workspace_id)}"'


POSTGRES_RECORDER_TOPIC = f"{__name__}:{KandevPostgresRecorder.__name__}"
POSTGRES_CONNINFO = "POSTGRES_CONNINFO"


class KandevPostgresFactory(PostgresFactory):
    """The library's factory, its pool connecting with the service's one
    conninfo (config.PostgresTarget) instead of the separate dbname, host,
    port, user and password it is built with: those lose a host list, a
    ``host=``/``port=`` list and every other libpq parameter
    (``target_session_attrs``, ``sslmode``, ...). The pool is built closed,
    so no connection was made with the separate arguments; psycopg_pool's
    ``conninfo`` and ``kwargs`` are what its ``_connect`` reads
    (tests/unit/test_library_internals.py checks both)."""

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        conninfo = self.env.get(POSTGRES_CONNINFO)
        if not conninfo:
            raise OSError(f"{POSTGRES_CONNINFO} missing from the event store's environment")
        pool = self.datastore.pool
        assert pool.closed, "the library's pool opened before its conninfo was set"
        pool.conninfo = conninfo
        pool.kwargs = {"row_factory": dict_row}


POSTGRES_FACTORY_TOPIC = f"{__name__}:{KandevPostgresFactory.__name__}"
