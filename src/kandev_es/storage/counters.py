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
