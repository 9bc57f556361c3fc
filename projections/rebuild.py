"""Blue/green projection rebuilds: replay the whole event store into fresh
``<table>_next`` tables, many events per transaction, then swap them in with
one transaction so readers never see an empty read model:

1. drop leftovers of an interrupted rebuild, create ``<table>_next`` (same DDL);
2. replay in big batches, tracked under ``<name>@rebuild``;
3. swap transaction: lock the live tracking row (live runners wait), apply the
   last few events, rename live → ``_old`` and next → live, drop old, give the
   indexes their live names, and move the tracking position over.

Nothing outside this rebuild is stopped; live runners simply wait out step 3.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from kandev_es.projections.base import Rebuildable
from kandev_es.projections.runner import ProjectionRunner

from kandev_es.errors import NotRebuildable, UnknownProjection, UnknownTopic
from kandev_es.storage.database import Transaction
from kandev_es.storage.schema import POSTGRES_DDL, SQLITE_DDL

NEXT = "_next"
SETTLE_SECONDS = 10.0
_INDEX = re.compile(r"^CREATE (?:UNIQUE )?INDEX IF NOT EXISTS (\w+)\s+ON (\w+) ")

Progress = Callable[[int, int, int], None]  # (position, head, events applied so far)


@dataclass(frozen=True)
class RebuildResult:
    name: str
    position: int
    applied: int
    seconds: float
    paused_seconds: float = 0.0  # how long saves waited for the switch

    @property
    def events_per_second(self) -> float:
        return self.position / self.seconds if self.seconds > 0 else float("inf")


def _ddl(backend: str, table: str) -> tuple[str, list[tuple[str, str]]]:
    """The live CREATE TABLE statement of ``table`` and its (index, statement) pairs."""
    statements = POSTGRES_DDL if backend == "postgres" else SQLITE_DDL
    create = [s for s in statements if s.startswith(f"CREATE TABLE IF NOT EXISTS {table} (")]
    if len(create) != 1:
        raise NotRebuildable(f"no DDL for table {table}")
    indexes = []
    for statement in statements:
        match = _INDEX.match(statement)
        if match and match.group(2) == table:
            indexes.append((match.group(1), statement))
    return create[0], indexes


def _create_next(tx: Transaction, backend: str, table: str) -> None:
    create, indexes = _ddl(backend, table)
    tx.execute(create)  # the live table, in case this deployment never had it
    for _, statement in indexes:
        tx.execute(statement)
    tx.execute(f"DROP TABLE IF EXISTS {table}{NEXT}")
    tx.execute(create.replace(f"EXISTS {table} (", f"EXISTS {table}{NEXT} (", 1))
    if backend == "postgres":  # SQLite cannot rename indexes: they are made at swap time
        for index, statement in indexes:
            statement = statement.replace(f"EXISTS {index}", f"EXISTS {index}{NEXT}", 1)
            tx.execute(statement.replace(f"ON {table} (", f"ON {table}{NEXT} (", 1))


def _swap(tx: Transaction, backend: str, table: str) -> None:
    tx.execute(f"ALTER TABLE {table} RENAME TO {table}_old")
    tx.execute(f"ALTER TABLE {table}{NEXT} RENAME TO {table}")
    tx.execute(f"DROP TABLE {table}_old")
    _, indexes = _ddl(backend, table)
    if backend != "postgres":
        for _, statement in indexes:
            tx.execute(statement)
        return
    from psycopg import sql

    rows = tx.execute(
        "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
        " AND tablename = ?",
        (table,),
    )
    for (index,) in rows:
        if NEXT in index:
            head, _, tail = str(index).rpartition(NEXT)
            rename = sql.SQL("ALTER INDEX {} RENAME TO {}").format(
                sql.Identifier(str(index)), sql.Identifier(head + tail)
            )
            tx.execute(rename.as_string(None))


def rebuildable(runner: ProjectionRunner, name: str) -> Any:
    try:
        projection = runner.get(name)
    except KeyError:
        names = ", ".join(p.name for p in runner.projections)
        raise UnknownProjection(f"no projection {name!r} (known: {names})") from None
    if not isinstance(projection, Rebuildable) or not projection.tables:
        raise NotRebuildable(f"projection {name!r} declares no tables to rebuild")
    return projection


def rebuild(
    runner: ProjectionRunner,
    name: str,
    progress: Progress | None = None,
    batch_size: int = 5000,
) -> RebuildResult:
    live = rebuildable(runner, name)
    fresh = live.with_suffix(NEXT)
    backend = runner.database.backend
    tracking = f"{name}@rebuild"
    started = time.monotonic()
    with runner.database.transaction() as tx:
        tx.execute("DELETE FROM projection_tracking WHERE name = ?", (tracking,))
        for table in live.tables:
            _create_next(tx, backend, table)
    applied = 0
    # Each checkpoint comes before its transaction (see storage/settled.py); the
    # first one's head is how far the replay goes before the swap.
    head = runner.checkpoint()
    settle_by = time.monotonic() + SETTLE_SECONDS
    while True:
        with runner.database.transaction() as tx:
            read = runner.apply_pending(tx, fresh, tracking, batch_size)
            position = _position(tx, tracking)
        applied += read
        if progress is not None:
            progress(position, max(head, position), applied)
        if position >= head or (not read and time.monotonic() > settle_by):
            break  # (an older transaction still open: the live runner goes on from here)
        if tracking in runner.stopped:
            break
        if not read:
            time.sleep(0.01)  # events below the head wait for an older transaction
        runner.checkpoint()
    _refuse_a_hole(runner, tracking)
    lock = " FOR UPDATE" if backend == "postgres" else ""
    runner.checkpoint()
    with runner.database.transaction() as tx:
        # The switch: saves wait (they write the live tables inline) while the
        # new tables take the events committed since the replay's last pass
        # and become the live ones; the saves then go on into them.
        paused = time.monotonic()
        _pause_writes(tx, runner)
        tx.execute("SELECT position FROM projection_tracking WHERE name = ?" + lock, (name,))
        while read := runner.apply_pending(tx, fresh, tracking, batch_size, writes_paused=True):
            applied += read
        _refuse_a_hole(runner, tracking)  # nothing swapped: the switch rolls back
        position = _position(tx, tracking)
        for table in live.tables:
            _swap(tx, backend, table)
        tx.execute(
            "INSERT INTO projection_tracking (name, position) VALUES (?, ?)"
            " ON CONFLICT (name) DO UPDATE SET position = excluded.position",
            (name, position),
        )
        tx.execute("DELETE FROM projection_tracking WHERE name = ?", (tracking,))
    paused = time.monotonic() - paused
    if progress is not None:
        progress(position, position, applied)
    return RebuildResult(name, position, applied, time.monotonic() - started, paused)


def _refuse_a_hole(runner: ProjectionRunner, tracking: str) -> None:
    """A replay that stopped at an event this version cannot read would swap
    in tables without it: refused (the live tables stay)."""
    if tracking in runner.stopped:
        raise UnknownTopic(f"rebuild refused: {runner.stopped[tracking]}")


def _pause_writes(tx: Transaction, runner: ProjectionRunner) -> None:
    """Hold every save until ``tx`` ends. PostgreSQL: the events table in
    EXCLUSIVE mode (reads go on; it waits for the saves under way, whose
    rows then all count); SQLite: ``tx`` already holds the one write lock."""
    if runner.database.backend != "postgres":
        return
    table = cast(Any, runner.app.recorder).events_table_sql
    tx.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")


def _position(tx: Transaction, tracking: str) -> int:
    rows = tx.execute("SELECT position FROM projection_tracking WHERE name = ?", (tracking,))
    return int(rows[0][0]) if rows else 0
