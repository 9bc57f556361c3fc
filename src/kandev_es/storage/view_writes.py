"""The read-model writes a save makes in its own transaction (docs/architecture.md:
Inline projections), described once and run by both recorders:

- ``ViewRows``: what one save changes, by kind of write (``WRITES``), each row
  a tuple of plain values (UUIDs as text) in the write's column order. A
  write with ``at`` takes, in that column, the notification id of the saved
  event whose index (in the save's event order) the row starts with: ids are
  drawn by the insert, so the rows name the event, not the id.
- SQLite (``apply_sqlite``): ``executemany`` per kind, on the cursor of the
  transaction that inserted the events.
- PostgreSQL (``postgres_function``): the rows go with the events, as one
  JSON document, in the save's one statement; ``kandev_apply_views`` writes
  them there, after the insert and the guard. An error inside it names the
  function in its context, which is how the recorder tells a failing view
  (``ViewsFailed``) from a version conflict.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kandev_es.errors import InternalError

ViewRows = Mapping[str, Sequence[tuple[Any, ...]]]
APPLY_VIEWS = "kandev_apply_views"


class ViewsFailed(InternalError):
    """A read-model write of a save failed: the whole save was rolled back."""


@dataclass(frozen=True)
class Write:
    key: str
    table: str
    kind: str  # insert | upsert | update | delete
    columns: tuple[tuple[str, str], ...]  # (name, PostgreSQL type), in row order
    keys: tuple[str, ...] = ()  # conflict target (insert, upsert) or match (update, delete)
    updates: tuple[str, ...] = ()  # columns an upsert or update sets
    at: str | None = None  # the column taking the position of the row's event

    def sqlite(self) -> str:
        """The statement ``executemany`` runs, one row of ``sqlite_row`` at a time."""
        return self._render(self.table, None)

    def sqlite_row(self, row: tuple[Any, ...], ids: Sequence[int]) -> tuple[Any, ...]:
        """The row's parameters in ``sqlite()``'s order."""
        values = dict(zip([name for name, _ in self.columns], row, strict=True))
        if self.at is not None:
            values[self.at] = ids[values[self.at]]
        if self.kind == "update":
            return tuple(values[c] for c in (*self.updates, *self.keys))
        return tuple(values.values())

    def postgres(self, schema: str) -> str:
        """The statement inside ``kandev_apply_views``: the rows are JSON
        arrays under ``views->'<key>'``; ``positions`` the save's ids."""
        values = []
        for index, (name, kind) in enumerate(self.columns):
            if name == self.at:
                values.append(f"positions[(r->>{index})::int + 1] AS {name}")
            else:
                values.append(f"(r->>{index})::{kind} AS {name}")
        rows = f"SELECT {', '.join(values)} FROM jsonb_array_elements(views->'{self.key}') AS r"
        return self._render(f"{schema}.{self.table}" if schema else self.table, rows)

    def _render(self, table: str, rows: str | None) -> str:
        """The statement on ``table``, its rows from the query ``rows``
        (PostgreSQL) or, without it, one row of parameters (SQLite)."""
        names = [name for name, _ in self.columns]
        if self.kind in ("insert", "upsert"):
            source = rows if rows is not None else f"VALUES ({', '.join('?' for _ in names)})"
            statement = f"INSERT INTO {table} ({', '.join(names)}) {source}"
            if self.kind == "upsert":
                sets = ", ".join(f"{c} = excluded.{c}" for c in self.updates)
                return statement + f" ON CONFLICT ({', '.join(self.keys)}) DO UPDATE SET {sets}"
            if self.keys:
                statement += f" ON CONFLICT ({', '.join(self.keys)}) DO NOTHING"
            return statement
        if rows is None:
            where = " AND ".join(f"{k} = ?" for k in self.keys)
            if self.kind == "delete":
                return f"DELETE FROM {table} WHERE {where}"
            return f"UPDATE {table} SET {', '.join(f'{c} = ?' for c in self.updates)} WHERE {where}"
        where = " AND ".join(f"t.{k} = v.{k}" for k in self.keys)
        if self.kind == "delete":
            return f"DELETE FROM {table} AS t USING ({rows}) AS v WHERE {where}"
        sets = ", ".join(f"{c} = v.{c}" for c in self.updates)
        return f"UPDATE {table} AS t SET {sets} FROM ({rows}) AS v WHERE {where}"


_TASK = (("task_id", "uuid"),)
WRITES: tuple[Write, ...] = (
    Write(
        "tasks_born", "tasks_view", "insert",
        (("position", "bigint"), *_TASK, ("workspace_id", "uuid"), ("identifier", "text"),
         ("external_id", "text"), ("phase", "text"), ("archived", "boolean"),
         ("revision", "integer"), ("dto", "text")),
        keys=("task_id",), at="position",
    ),
    Write(
        "tasks_changed", "tasks_view", "update",
        (*_TASK, ("external_id", "text"), ("phase", "text"), ("archived", "boolean"),
         ("revision", "integer"), ("dto", "text")),
        keys=("task_id",), updates=("external_id", "phase", "archived", "revision", "dto"),
    ),
    Write("tasks_gone", "tasks_view", "delete", _TASK, keys=("task_id",)),
    Write(
        "identities", "identities_view", "upsert",
        (("identity_id", "uuid"), ("workspace_id", "uuid"), ("external_id", "text"),
         ("task_id", "uuid"), ("tenure", "integer"), ("phase", "text"), ("held", "boolean")),
        keys=("identity_id",), updates=("task_id", "tenure", "phase", "held"),
    ),
    Write(
        "creations", "creations_view", "upsert",
        (("identity_id", "uuid"), ("tenure", "integer"), ("workspace_id", "uuid"),
         ("task_id", "uuid"), ("phase", "text"), ("epoch", "integer"),
         ("lease_expires_at", "double precision")),
        keys=("identity_id", "tenure"), updates=("phase", "epoch", "lease_expires_at"),
    ),
    Write(
        "creations_gone", "creations_view", "delete",
        (("identity_id", "uuid"), ("tenure", "integer")), keys=("identity_id", "tenure"),
    ),
    Write(
        "feed", "feed_events", "insert",
        (("position", "bigint"), ("workspace_id", "uuid"), ("event_id", "uuid"),
         ("type", "text"), ("subject", "uuid"), ("timestamp", "text"), ("data", "text")),
        at="position",
    ),
    Write(
        "feed_tasks", "feed_tasks", "upsert", (*_TASK, ("dto", "text")),
        keys=("task_id",), updates=("dto",),
    ),
    Write("feed_tasks_gone", "feed_tasks", "delete", _TASK, keys=("task_id",)),
    # Erasure (storage/sealing.py, erasure/): a new task's data key, stored
    # with its first events; a forgotten task's key deleted and its earlier
    # feed rows rewritten without its free text, with its Forgotten events.
    Write("task_keys", "task_keys", "insert", (*_TASK, ("data_key", "text"))),
    Write("task_keys_gone", "task_keys", "delete", _TASK, keys=("task_id",)),
    Write(
        "feed_forgotten", "feed_events", "update", (("position", "bigint"), ("data", "text")),
        keys=("position",), updates=("data",),
    ),
    # ... and the webhook delivery log's answers to its events (a receiver's
    # answer may echo the title it got: webhooks/transport.py's snippet).
    Write(
        "deliveries_forgotten", "webhook_deliveries", "update",
        (("position", "bigint"), ("snippet", "text")), keys=("position",), updates=("snippet",),
    ),
)  # fmt: skip
_BY_KEY = {write.key: write for write in WRITES}
_SQLITE = {write.key: write.sqlite() for write in WRITES}


def apply_sqlite(cursor: Any, views: ViewRows, ids: Sequence[int]) -> None:
    """Write ``views`` with the cursor of the save's transaction; any error
    is ``ViewsFailed`` (the caller's transaction then rolls back)."""
    try:
        for key, rows in views.items():
            if rows:
                write = _BY_KEY[key]
                cursor.executemany(_SQLITE[key], [write.sqlite_row(row, ids) for row in rows])
    except Exception as error:
        raise ViewsFailed(f"a read model refused the save: {error}") from error


def views_json(views: ViewRows | None) -> str | None:
    """The document ``kandev_apply_views`` reads: only the kinds with rows."""
    if not views:
        return None
    document = {key: rows for key, rows in views.items() if rows}
    return json.dumps(document, separators=(",", ":")) if document else None


def postgres_function(function: str, schema: str) -> str:
    """``kandev_apply_views(views jsonb, positions bigint[])``: each kind of
    write present in ``views``, in ``WRITES`` order (deletions of a table
    after its inserts: a save never both makes and removes one row)."""
    body = " ".join(
        f"IF views ? '{write.key}' THEN {write.postgres(schema)}; END IF;" for write in WRITES
    )
    return (
        f"CREATE OR REPLACE FUNCTION {function}(views jsonb, positions bigint[])"
        f" RETURNS void LANGUAGE plpgsql AS $VIEWS$ BEGIN {body} END $VIEWS$"
    )
