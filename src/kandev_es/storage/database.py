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
from urllib.parse import parse_qs, unquote, urlparse

from kandev_es.errors import StoreUnavailable
from kandev_es.storage.breaker import StoreBreaker, means_unreachable

Row = tuple[Any, ...]


class Transaction(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[Row]: ...

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...


class Database(Protocol):
    backend: str

    def transaction(self) -> Any: ...

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
        url: str,
        schema: str | None,
        pool_size: int = 5,
        breaker: StoreBreaker | None = None,
        timeout: int = 1,
    ) -> None:
        from psycopg_pool import ConnectionPool

        from kandev_es.storage.pools import serve_most_recent_first
        from kandev_es.storage.reconnect import reconnect_quickly

        reconnect_quickly()
        self.url = url
        self.schema = schema
        self.breaker = breaker or StoreBreaker()
        # The pool waits `timeout`; libpq itself is not reliable under 2 s.
        kwargs: dict[str, Any] = {"connect_timeout": max(2, timeout)}
        if schema:
            kwargs["options"] = f"-c search_path={schema}"
        # Checked on checkout, so a connection killed by a database restart is
        # replaced instead of failing the request that draws it.
        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=max(pool_size, 2),
            kwargs=kwargs,
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
        except (psycopg.OperationalError, PoolTimeout) as error:
            if means_unreachable(error):
                self.breaker.failed(str(error))
            raise StoreUnavailable(f"database unavailable: {error}") from None
        except BaseException:
            self.breaker.succeeded(started)
            raise
        self.breaker.succeeded(started)

    def create_schema(self) -> None:
        if not self.schema:
            return
        from psycopg import sql

        statement = sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema))
        with self.transaction() as tx:
            tx.execute(statement.as_string(None))

    def close(self) -> None:
        self._pool.close()


def parse_postgres_url(url: str) -> dict[str, str]:
    """Split a postgresql:// URL into the eventsourcing library's settings."""
    parsed = urlparse(url)
    if parsed.scheme not in ("postgres", "postgresql"):
        raise ValueError(f"not a PostgreSQL URL: {url!r}")
    query = parse_qs(parsed.query)
    settings = {
        "POSTGRES_DBNAME": unquote(parsed.path.lstrip("/")) or "postgres",
        "POSTGRES_HOST": parsed.hostname or "127.0.0.1",
        "POSTGRES_PORT": str(parsed.port or 5432),
        "POSTGRES_USER": unquote(parsed.username or "postgres"),
        "POSTGRES_PASSWORD": unquote(parsed.password or ""),
    }
    if "schema" in query:
        settings["POSTGRES_SCHEMA"] = query["schema"][0]
    return settings


def base_postgres_url(url: str) -> str:
    """The URL without our own ``schema`` query parameter (libpq rejects it)."""
    parsed = urlparse(url)
    query = "&".join(
        f"{key}={value}"
        for key, values in parse_qs(parsed.query).items()
        if key != "schema"
        for value in values
    )
    return parsed._replace(query=query).geturl()
