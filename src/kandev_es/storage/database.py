"""A small connection adapter over SQLite and PostgreSQL for our own tables
(read models, tracking positions, office counters). SQL is written once with
``?`` placeholders; the PostgreSQL adapter turns them into ``%s``."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from kandev_es.config import PostgresTarget
from kandev_es.errors import StoreUnavailable
from kandev_es.storage.breaker import (
    StoreBreaker,
    means_node_lost,
    means_read_only,
    means_unreachable,
)

Row = tuple[Any, ...]


class Transaction(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[Row]: ...

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...


class Database(Protocol):
    backend: str

    def transaction(self) -> Any: ...

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[Row]: ...

    def close(self) -> None: ...


class _SQLiteTransaction:
    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return list(self._connection.execute(sql, tuple(params)).fetchall())

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self._connection.executemany(sql, [tuple(r) for r in rows])


class SQLiteDatabase:
    backend = "sqlite"

    def __init__(self, path: Path, busy_timeout_ms: int = 60_000) -> None:
        self.path = path
        self._busy_timeout_ms = busy_timeout_ms
        self._local = threading.local()

    def _connection(self) -> sqlite3.Connection:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = sqlite3.connect(
                str(self.path), isolation_level=None, check_same_thread=False
            )
            connection.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_ms)}")
            connection.execute("PRAGMA journal_mode=WAL")
            self._local.connection = connection
        return connection

    @contextmanager
    def transaction(self) -> Iterator[_SQLiteTransaction]:
        connection = self._connection()
        # IMMEDIATE takes the write lock up front, so a read-then-write
        # transaction cannot deadlock against another writer.
        connection.execute("BEGIN IMMEDIATE")
        try:
            yield _SQLiteTransaction(connection)
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        else:
            connection.execute("COMMIT")

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """One statement on its own, outside any write transaction: in WAL mode
        it neither waits for the writer nor holds it up (``transaction`` takes
        the write lock first)."""
        return list(self._connection().execute(sql, tuple(params)).fetchall())

    def close(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None


class _PostgresTransaction:
    def __init__(self, connection: Any) -> None:
        self._connection = connection

    @staticmethod
    def _sql(sql: str) -> str:
        return sql.replace("?", "%s")

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        cursor = self._connection.execute(self._sql(sql), tuple(params))
        return list(cursor.fetchall()) if cursor.description else []

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self._connection.cursor() as cursor:
            cursor.executemany(self._sql(sql), [tuple(r) for r in rows])


class PostgresDatabase:
    backend = "postgres"

    def __init__(
        self,
        target: PostgresTarget,
        pool_size: int = 5,
        breaker: StoreBreaker | None = None,
        timeout: int = 1,
    ) -> None:
        from psycopg_pool import ConnectionPool

        from kandev_es.storage.pools import serve_most_recent_first
        from kandev_es.storage.reconnect import reconnect_quickly

        reconnect_quickly()
        self.target = target
        # The one conninfo every connection uses (config.PostgresTarget): the
        # same servers, target_session_attrs and connect_timeout (libpq's
        # own is not reliable under 2 s; the pool waits `timeout`). This pool
        # adds the schema as its search_path.
        self.conninfo = target.conninfo
        self.schema = target.schema
        self.breaker = breaker or StoreBreaker()
        # Checked on checkout, so a connection killed by a database restart is
        # replaced instead of failing the request that draws it.
        self._pool = ConnectionPool(
            target.schema_conninfo,
            min_size=1,
            max_size=max(pool_size, 2),
            open=True,
            timeout=timeout,
            check=ConnectionPool.check_connection,
        )
        serve_most_recent_first(self._pool)

    @contextmanager
    def transaction(self) -> Iterator[_PostgresTransaction]:
        import psycopg
        from psycopg_pool import PoolTimeout

        self.breaker.admit()
        started = self.breaker.now()
        try:
            with self._pool.connection() as connection, connection.transaction():
                yield _PostgresTransaction(connection)
        except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout) as error:
            if means_unreachable(error):
                self.breaker.failed(str(error))
            elif means_node_lost(error):
                self._pool.drain()  # every connection to that node: closed, not reused
            raise StoreUnavailable(f"database unavailable: {error}") from None
        except psycopg.Error as error:
            if not means_read_only(error):
                self.breaker.succeeded(started)
                raise
            # A standby, or a primary being demoted: a failover under way.
            self._pool.drain()
            raise StoreUnavailable(f"database node is read-only (failover?): {error}") from None
        except BaseException:
            self.breaker.succeeded(started)
            raise
        self.breaker.succeeded(started)

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """One statement (in a transaction of its own)."""
        with self.transaction() as tx:
            return tx.execute(sql, params)

    def create_schema(self) -> None:
        if not self.schema:
            return
        from psycopg import sql

        statement = sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema))
        with self.transaction() as tx:
            tx.execute(statement.as_string(None))

    def close(self) -> None:
        self._pool.close()

