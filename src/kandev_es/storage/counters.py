"""Office task identifiers (``KAN-42``). The counter never goes back: a
PostgreSQL sequence (no commit of its own), a counter row on SQLite. A
concurrent loser's number stays unused — the one gap in office numbers we accept.
The number is drawn by the event store's recorder (``next_office_number``), on
the connections the create already uses."""

from __future__ import annotations

import uuid

from kandev_es.storage.database import Database


def sequence_name(workspace_id: uuid.UUID) -> str:
    return f"office_seq_{workspace_id.hex}"


def ensure_counter(database: Database, workspace_id: uuid.UUID) -> None:
    if database.backend != "postgres":
        return
    from psycopg import sql

    statement = sql.SQL("CREATE SEQUENCE IF NOT EXISTS {}").format(
        sql.Identifier(sequence_name(workspace_id))
    )
    with database.transaction() as tx:
        tx.execute(statement.as_string(None))


def advance_counter(database: Database, workspace_id: uuid.UUID, by: int) -> int:
    """Move the workspace's counter ``by`` numbers past the last one it issued,
    in one statement; return the lowest number it can issue next. After a
    restore from a dump, numbers issued after the backup are not in it: moving
    past them keeps a new task from taking one a caller already saw."""
    if database.backend != "postgres":
        with database.transaction() as tx:
            [(last,)] = tx.execute(
                "INSERT INTO office_counters (workspace_id, last_value) VALUES (?, ?)"
                " ON CONFLICT (workspace_id) DO UPDATE SET last_value = last_value + ?"
                " RETURNING last_value",
                (str(workspace_id), by, by),
            )
        return int(last) + 1
    from psycopg import sql

    ensure_counter(database, workspace_id)
    sequence = sql.Identifier(sequence_name(workspace_id))
    statement = sql.SQL(
        "SELECT setval(?::regclass, (SELECT CASE WHEN is_called THEN last_value"
        " ELSE last_value - 1 END FROM {0}) + ?)"
    ).format(sequence)
    with database.transaction() as tx:
        [(last,)] = tx.execute(statement.as_string(None), (sequence.as_string(None), by))
    return int(last) + 1
