"""Office task identifiers (``KAN-42``). The counter never goes back: a
PostgreSQL sequence (no commit of its own), a counter row on SQLite. A
concurrent loser's number stays unused — the single leak the seed permits."""

from __future__ import annotations

import uuid

from kandev_es.storage.database import Database


def _sequence_name(workspace_id: uuid.UUID) -> str:
    return f"office_seq_{workspace_id.hex}"


def ensure_counter(database: Database, workspace_id: uuid.UUID) -> None:
    if database.backend != "postgres":
        return
    from psycopg import sql

    statement = sql.SQL("CREATE SEQUENCE IF NOT EXISTS {}").format(
        sql.Identifier(_sequence_name(workspace_id))
    )
    with database.transaction() as tx:
        tx.execute(statement.as_string(None))


def next_office_number(database: Database, workspace_id: uuid.UUID) -> int:
    with database.transaction() as tx:
        if database.backend == "postgres":
            rows = tx.execute("SELECT nextval(?::regclass)", (_sequence_name(workspace_id),))
        else:
            rows = tx.execute(
                "INSERT INTO office_counters (workspace_id, last_value) VALUES (?, 1)"
                " ON CONFLICT (workspace_id) DO UPDATE SET last_value = last_value + 1"
                " RETURNING last_value",
                (str(workspace_id),),
            )
    return int(rows[0][0])
