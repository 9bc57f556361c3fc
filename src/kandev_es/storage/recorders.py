"""The PostgreSQL event store recorder, with what the create protocol needs
beyond the library's (the SQLite one is ``sqlite_recorder``; this module is
imported only when the database URL is PostgreSQL, psycopg being an extra):

- **fail fast** (PostgreSQL): the library retries every call ten times, each
  waiting up to the pool timeout, so a request against a stopped database hung
  for about fifty seconds. Here a failed call is retried once, after the pool
  has dropped its broken connections (a restart kills them all at once); a
  second failure is final and the caller answers 503 (``StoreBreaker`` answers
  the calls after it at once).
- **several streams in one query** (``select_streams``): the events after a
  given version of each of several aggregates, so a retry's Found costs one
  round trip instead of one per aggregate.
- **a guarded save** (``insert_events(..., unchanged={id: version})``): the
  events are written only if none of the named streams has moved past the
  version the caller read, checked inside the write transaction, after the
  table lock that orders all writers. Otherwise nothing is written and
  ``StreamsAdvanced`` is raised.
- **the office counter** (``next_office_number``) on the same connections, one
  statement, so a create does not need a second pool for it."""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg
from eventsourcing.persistence import InterfaceError, OperationalError, StoredEvent
from eventsourcing.postgres import PostgresAggregateRecorder, PostgresApplicationRecorder
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Identifier
from psycopg_pool import PoolTimeout

from kandev_es.storage.counters import sequence_name
from kandev_es.storage.pools import serve_most_recent_first
from kandev_es.storage.streams import Since, StreamsAdvanced, Versions

F = TypeVar("F", bound=Callable[..., Any])
FAST_FAILURE_S = 0.25


def _unretried(method: Any) -> Any:
    # eventsourcing's retry decorator keeps the plain method in __wrapped__
    # (functools.wraps); tests/unit/test_library_internals.py checks it.
    return getattr(method, "__wrapped__", method)


def _retry_once_after_pool_check(method: F) -> F:
    @functools.wraps(method)
    def call(self: PostgresApplicationRecorder, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return method(self, *args, **kwargs)
        except (InterfaceError, OperationalError) as error:
            # Retry only what a restart leaves behind: a pooled connection that
            # failed at once. A pool timeout or a slow failure means the database
            # is unreachable, and waiting again would only double the wait.
            if isinstance(error.__cause__, PoolTimeout) or (
                time.monotonic() - started > FAST_FAILURE_S
            ):
                raise
            self.datastore.pool.check()  # drop dead connections, start new ones
            return method(self, *args, **kwargs)

    return call  # type: ignore[return-value]


def _tuples(conn: psycopg.Connection[Any]) -> psycopg.Cursor[tuple[Any, ...]]:
    """A cursor yielding plain tuples: the pool's dict rows rebuild the column
    names for every row, a quarter of a Found's query time."""
    return psycopg.Cursor(conn, row_factory=tuple_row)


class KandevPostgresRecorder(PostgresApplicationRecorder):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        serve_most_recent_first(self.datastore.pool)
        schema = Identifier(self.datastore.schema)
        table = SQL("{0}.{1}").format(schema, Identifier(self.events_table_name))
        self._table_sql = table.as_string(None)
        self._select_streams_sql: dict[int, str] = {}
        # One statement per save instead of the library's pipelined BEGIN, SET,
        # LOCK, NOTIFY, INSERT, COMMIT: the same table lock (commit order =
        # notification order), then the guard, then the insert, in the one
        # implicit transaction of an autocommit call. Plain arrays, not the
        # composite type, sent in binary (%b): the text form of a bytea array
        # cost more to escape and parse than the insert itself.
        function = SQL("{0}.kandev_insert_events").format(schema)
        self.sql_create_statements.append(
            SQL(
                "CREATE OR REPLACE FUNCTION {function}("
                "ids uuid[], versions bigint[], topics text[], states bytea[],"
                " guard_ids uuid[], guard_versions bigint[])"
                " RETURNS SETOF bigint LANGUAGE plpgsql AS $BODY$"
                " BEGIN"
                "  LOCK TABLE {table} IN EXCLUSIVE MODE;"
                "  FOR i IN 1 .. coalesce(array_length(guard_ids, 1), 0) LOOP"
                "   IF EXISTS (SELECT 1 FROM {table} WHERE originator_id = guard_ids[i]"
                "    AND originator_version > guard_versions[i]) THEN RETURN; END IF;"
                "  END LOOP;"
                "  NOTIFY {channel};"
                "  RETURN QUERY INSERT INTO {table}"
                "   (originator_id, originator_version, topic, state)"
                "   SELECT * FROM unnest(ids, versions, topics, states)"
                "   RETURNING notification_id;"
                " END $BODY$"
            ).format(function=function, table=table, channel=Identifier(self.channel_name))
        )
        self._insert_sql = SQL(
            "SELECT {0}(%b::uuid[], %b::bigint[], %b::text[], %b::bytea[],"
            " %b::uuid[], %b::bigint[]) AS id"
        ).format(function).as_string(None)
        quoted_schema = '"' + self.datastore.schema.replace('"', '""') + '"'
        self._sequence_prefix = quoted_schema + "."

    @_retry_once_after_pool_check
    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        if not stored_events:
            return []
        unchanged: Versions = kwargs.get("unchanged") or {}
        params = (
            [e.originator_id for e in stored_events],
            [e.originator_version for e in stored_events],
            [e.topic for e in stored_events],
            [e.state for e in stored_events],
            list(unchanged),
            list(unchanged.values()),
        )
        with self.datastore.get_connection() as conn:
            rows = _tuples(conn).execute(self._insert_sql, params, prepare=True).fetchall()
        ids = [row[0] for row in rows]
        if not ids:
            raise StreamsAdvanced("a stream this save depends on has moved on")
        return ids

    select_events = _retry_once_after_pool_check(
        _unretried(PostgresAggregateRecorder.select_events)
    )
    select_notifications = _retry_once_after_pool_check(
        _unretried(PostgresApplicationRecorder.select_notifications)
    )
    max_notification_id = _retry_once_after_pool_check(
        _unretried(PostgresApplicationRecorder.max_notification_id)
    )

    def _streams_statement(self, count: int) -> str:
        # One OR term per stream, each a primary-key range: planned cheaply and
        # prepared once per arity (a join over unnest() cost four times more).
        statement = self._select_streams_sql.get(count)
        if statement is None:
            terms = " OR ".join(["(originator_id = %b AND originator_version > %b)"] * count)
            statement = (
                f"SELECT originator_id, originator_version, topic, state"
                f" FROM {self._table_sql} WHERE {terms}"
                f" ORDER BY originator_id, originator_version"
            )
            self._select_streams_sql[count] = statement
        return statement

    @_retry_once_after_pool_check
    def select_streams(self, since: Since) -> list[StoredEvent]:
        params = [value for key, version in since for value in (key, version)]
        statement = self._streams_statement(len(since))
        # Straight from the pool, without the library's per-call wrapper and the
        # no-op commit of an autocommit connection: this is every Found's query.
        pool = self.datastore.pool
        if pool.closed:
            pool.open(wait=True, timeout=30.0)
        try:
            conn = pool.getconn()
            try:
                rows = _tuples(conn).execute(statement, params, prepare=True).fetchall()
            finally:
                pool.putconn(conn)
        except (psycopg.OperationalError, psycopg.InterfaceError) as error:
            raise OperationalError(str(error)) from error
        return [
            StoredEvent(
                originator_id=originator_id,
                originator_version=originator_version,
                topic=topic,
                state=bytes(state),
            )
            for originator_id, originator_version, topic, state in rows
        ]

    @_retry_once_after_pool_check
    def next_office_number(self, workspace_id: uuid.UUID) -> int:
        sequence = f'{self._sequence_prefix}"{sequence_name(workspace_id)}"'
        with self.datastore.get_connection() as conn:
            row = _tuples(conn).execute(
                "SELECT nextval(%b::regclass)", (sequence,), prepare=True
            ).fetchone()
        assert row is not None
        return int(row[0])


POSTGRES_RECORDER_TOPIC = f"{__name__}:{KandevPostgresRecorder.__name__}"
