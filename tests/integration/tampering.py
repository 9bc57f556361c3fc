"""What an attacker with write access to the database does, in plain SQL on
either backend (tests/integration/test_ledger.py). Each function tampers with
one identity stream and returns the version a verifier must name."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kandev_es_client import ledger as chains
from kandev_es_client import merkle

from kandev_es.storage.ledger import stream_key


def _where(services, stream):
    return services.app.recorder.events_table_name, stream_key(services.database.backend, stream)


def edit(services, stream) -> int:
    table, key = _where(services, stream)
    with services.database.transaction() as tx:
        (state,) = tx.execute(f"SELECT state FROM {table} WHERE originator_id = ?"
                              " AND originator_version = 2", (key,))[0]
        tx.execute(f"UPDATE {table} SET state = ? WHERE originator_id = ?"
                   " AND originator_version = 2", (bytes(state) + b" ", key))
    return 2


def delete(services, stream) -> int:
    table, key = _where(services, stream)
    with services.database.transaction() as tx:
        tx.execute(f"DELETE FROM {table} WHERE originator_id = ? AND originator_version = 2",
                   (key,))
    return 2


def swap(services, stream) -> int:
    table, key = _where(services, stream)
    with services.database.transaction() as tx:
        for old, new in ((2, -2), (3, 2), (-2, 3)):
            tx.execute(f"UPDATE {table} SET originator_version = ? WHERE originator_id = ?"
                       " AND originator_version = ?", (new, key, old))
    return 2


def cut(services, stream) -> int:
    """The stream's last event (its Completed) and the one before it gone."""
    table, key = _where(services, stream)
    with services.database.transaction() as tx:
        (last,) = tx.execute(f"SELECT max(originator_version) FROM {table}"
                             " WHERE originator_id = ?", (key,))[0]
        tx.execute(f"DELETE FROM {table} WHERE originator_id = ? AND originator_version >= ?",
                   (key, int(last) - 1))
    return int(last)


def drop_stream(services, stream) -> int:
    table, key = _where(services, stream)
    with services.database.transaction() as tx:
        tx.execute(f"DELETE FROM {table} WHERE originator_id = ?", (key,))
    return 1


def rewrite(services, stream) -> int:
    """Edit version 2, then recompute the stream's chain in the log's leaves
    and every node of the tree, consistently: only a signed checkpoint from
    before the edit can tell."""
    edit(services, stream)
    table, key = _where(services, stream)
    with services.database.transaction() as tx:
        rows = tx.execute(f"SELECT originator_version, topic, state FROM {table}"
                          " WHERE originator_id = ? ORDER BY originator_version", (key,))
        hashes = chains.chain(stream, [(int(v), t, bytes(s)) for v, t, s in rows])
        for (version, _, _), value in zip(rows, hashes, strict=True):
            for where in ("ledger_leaves", table):
                tx.execute(f"UPDATE {where} SET chain_hash = ? WHERE originator_id = ?"
                           " AND originator_version = ?", (value, key, int(version)))
        tree = merkle.MemoryTree()
        for (value,) in tx.execute("SELECT chain_hash FROM ledger_leaves ORDER BY leaf_index"):
            tree.append(bytes(value))
        tx.execute("DELETE FROM ledger_nodes")
        tx.executemany("INSERT INTO ledger_nodes (level, node_index, hash) VALUES (?, ?, ?)",
                       [(lv, ix, h) for (lv, ix), h in tree.nodes.items()])
    return 2


@contextmanager
def in_the_store(services) -> Iterator[Any]:
    """The attacker's SQL: on SQLite straight into the file (Python's sqlite3,
    not the application's connections), on PostgreSQL as the tables' owner.
    ``execute(sql, params)`` with ``?`` placeholders on both."""
    if services.database.backend == "postgres":
        with services.database.transaction() as tx:
            yield tx
        return
    connection = sqlite3.connect(services.settings.sqlite_path, timeout=10)
    try:
        with connection:
            yield connection
    finally:
        connection.close()


def unlog(services, stream, cut: bool = False) -> None:
    """The issue's attack: edit version 2 (or ``cut`` the stream's last
    event), set every chain hash to NULL and empty the log, so the next start
    re-logs the forged history from scratch; what a signer must refuse to sign."""
    table, key = _where(services, stream)
    with in_the_store(services) as sql:
        if cut:
            sql.execute(f"DELETE FROM {table} WHERE originator_id = ? AND originator_version ="
                        f" (SELECT max(originator_version) FROM {table} WHERE originator_id = ?)",
                        (key, key))
        else:
            (state,) = next(iter(sql.execute(f"SELECT state FROM {table} WHERE originator_id"
                                             " = ? AND originator_version = 2", (key,))))
            sql.execute(f"UPDATE {table} SET state = ? WHERE originator_id = ?"
                        " AND originator_version = 2", (bytes(state) + b" ", key))
        sql.execute(f"UPDATE {table} SET chain_hash = NULL")
        for ledger_table in ("ledger_leaves", "ledger_nodes", "ledger_checkpoints"):
            sql.execute(f"DELETE FROM {ledger_table}")


TAMPERING = {f.__name__: f for f in (edit, delete, swap, cut, drop_stream, rewrite)}


def _position(services) -> str:
    return "notification_id" if services.database.backend == "postgres" else "rowid"


def swap_positions(services, first, second) -> tuple[int, int]:
    """The stored positions of the two streams' first events swapped and the
    leaves re-pointed to follow them, the tree untouched: each leaf still
    finds its event, only the store's order is no longer the log's."""
    table, position = services.app.recorder.events_table_name, _position(services)
    keys = [stream_key(services.database.backend, s) for s in (first, second)]
    with in_the_store(services) as sql:
        (a,), (b,) = (next(iter(sql.execute(
            f"SELECT {position} FROM {table} WHERE originator_id = ? AND originator_version = 1",
            (key,)))) for key in keys)
        (top,) = next(iter(sql.execute(f"SELECT max({position}) FROM {table}")))
        spare = int(top) + 1_000_000
        for where in ((table, position), ("ledger_leaves", "notification_id")):
            for old, new in ((a, spare), (b, a), (spare, b)):
                sql.execute(f"UPDATE {where[0]} SET {where[1]} = ? WHERE {where[1]} = ?",
                            (new, old))
    return int(a), int(b)


def upper_case(services, stream, version: int) -> None:
    """SQLite: the event stored under its stream id in upper-case hex (after
    dropping the store's guard against it, as an attacker with the file
    would); the same UUID to a parser, another stream to the application's
    exact lookup. On PostgreSQL the uuid column has one spelling only."""
    table, key = _where(services, stream)
    with in_the_store(services) as sql:
        if services.database.backend == "postgres":
            sql.execute(f"UPDATE {table} SET originator_id = upper(originator_id::text)::uuid"
                        " WHERE originator_id = ? AND originator_version = ?", (key, version))
            return
        for trigger in ("", "_update"):
            sql.execute(f"DROP TRIGGER IF EXISTS {table}_canonical_stream_id{trigger}")
        sql.execute(f"UPDATE {table} SET originator_id = upper(originator_id)"
                    " WHERE originator_id = ? AND originator_version = ?", (key, version))
