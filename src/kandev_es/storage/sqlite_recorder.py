"""The SQLite event store recorder (the embedded default), with the create
protocol's extras the PostgreSQL recorder in ``recorders`` also has: several
streams in one query (``select_streams``), a guarded save
(``insert_events(..., unchanged={id: version})``) and the office counter
(``next_office_number``). Imports nothing PostgreSQL-only: a plain
``pip install`` has no psycopg."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from eventsourcing.persistence import StoredEvent
from eventsourcing.sqlite import SQLiteApplicationRecorder
from kandev_es_client.ledger import chain_hash

from kandev_es.storage.chains import known_chain_hashes
from kandev_es.storage.notifier import SAVES
from kandev_es.storage.settled import Settled
from kandev_es.storage.streams import Since, StreamsAdvanced, Versions
from kandev_es.storage.view_writes import ViewRows, apply_sqlite

# SQLite's SQLITE_MAX_COMPOUND_SELECT (500): the streams one statement reads.
COMPOUND_SELECTS = 400


class KandevSQLiteRecorder(SQLiteApplicationRecorder):
    # Off (KANDEV_LEDGER_SAVE_CHAINS, set by application.Tasks): the save writes
    # no chain hash and only the sequencer's log chains the events.
    save_chains = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Named columns: the library's VALUES (?,?,?,?) fails once the table
        # has its chain_hash column (``_insert_rows`` fills it).
        self.insert_events_statement = (
            f"INSERT INTO {self.events_table_name}"
            " (originator_id, originator_version, topic, state) VALUES (?,?,?,?)"
        )
        self._insert_chained = (
            f"INSERT INTO {self.events_table_name}"
            " (originator_id, originator_version, topic, state, chain_hash) VALUES (?,?,?,?,?)"
        )

    def next_office_number(self, workspace_id: uuid.UUID) -> int:
        with self.datastore.transaction(commit=True) as c:
            c.execute(
                "INSERT INTO office_counters (workspace_id, last_value) VALUES (?, 1)"
                " ON CONFLICT (workspace_id) DO UPDATE SET last_value = last_value + 1"
                " RETURNING last_value",
                (str(workspace_id),),
            )
            return int(c.fetchone()[0])

    def next_office_numbers(self, workspace_id: uuid.UUID, count: int) -> list[int]:
        """``count`` office numbers in one statement (a batch of creates)."""
        with self.datastore.transaction(commit=True) as c:
            c.execute(
                "INSERT INTO office_counters (workspace_id, last_value) VALUES (?, ?)"
                " ON CONFLICT (workspace_id) DO UPDATE SET last_value = last_value + ?"
                " RETURNING last_value",
                (str(workspace_id), count, count),
            )
            last = int(c.fetchone()[0])
        return list(range(last - count + 1, last + 1))

    # The head the last checkpoint read (a pass checkpoints before it reads).
    _checkpointed = 0

    def checkpoint(self) -> int:
        self._checkpointed = head = int(self.max_notification_id() or 0)
        return head

    def first_unknown(self, after: int, upto: int, known: Sequence[str]) -> tuple[int, str] | None:
        """The first notification in (after, upto] whose topic is not in ``known``."""
        marks = ", ".join("?" for _ in known)
        with self.datastore.transaction(commit=False) as c:
            c.execute(
                f"SELECT rowid, topic FROM {self.events_table_name} WHERE rowid > ?"
                f" AND rowid <= ? AND topic NOT IN ({marks}) ORDER BY rowid LIMIT 1",
                (after, upto, *known),
            )
            row = c.fetchone()
        return None if row is None else (int(row[0]), str(row[1]))

    def read_settled(self, after: int, limit: int, topics: Sequence[str] = ()) -> Settled:
        """One writer commits ids in order, so everything up to a head read
        before (the last checkpoint's, whichever thread took it) is committed
        and nothing below it can appear later: every projection of a pass reads
        without asking for the head again."""
        head = self._checkpointed
        notifications = list(
            self.select_notifications(
                start=after, limit=limit, topics=list(topics), inclusive_of_start=False
            )
        )
        return Settled(notifications, max(head, notifications[-1].id if notifications else 0))

    def select_task_keys(self, task_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, bytes]:
        """The stored data keys of those of ``task_ids`` that have one (storage/sealing.py)."""
        marks = ", ".join("?" for _ in task_ids)
        with self.datastore.transaction(commit=False) as c:
            c.execute(
                f"SELECT task_id, data_key FROM task_keys WHERE task_id IN ({marks})",
                [str(task_id) for task_id in task_ids],
            )
            return {uuid.UUID(row[0]): bytes.fromhex(row[1]) for row in c.fetchall()}

    def select_streams(self, since: Since) -> list[StoredEvent]:
        one = (
            f"SELECT originator_id, originator_version, topic, state"
            f" FROM {self.events_table_name} WHERE originator_id = ? AND originator_version > ?"
        )
        rows = []
        with self.datastore.transaction(commit=False) as c:
            # SQLite allows at most 500 SELECTs in one compound statement.
            for start in range(0, len(since), COMPOUND_SELECTS):
                part = since[start : start + COMPOUND_SELECTS]
                c.execute(
                    " UNION ALL ".join([one] * len(part)),
                    [p for key, version in part for p in (key.hex, version)],
                )
                rows.extend(c.fetchall())
        events = [
            StoredEvent(
                originator_id=self.convert_originator_id(row["originator_id"]),
                originator_version=row["originator_version"],
                topic=row["topic"],
                state=row["state"],
            )
            for row in rows
        ]
        events.sort(key=lambda e: (str(e.originator_id), e.originator_version))
        return events

    def insert_events(self, stored_events: Sequence[StoredEvent],
                      **kwargs: Any) -> Sequence[int] | None:
        ids = super().insert_events(stored_events, **kwargs)
        SAVES.ring()  # committed: wakes this process's open event streams
        return ids

    def _insert_events(self, c: Any, stored_events: Sequence[StoredEvent],
                       **kwargs: Any) -> Sequence[int] | None:
        ids = self._insert_rows(c, stored_events)
        unchanged: Versions | None = kwargs.get("unchanged")
        if unchanged:
            # The transaction holds the write lock (it began IMMEDIATE), so this
            # sees every committed write; raising here rolls the transaction back.
            for key, version in unchanged.items():
                c.execute(
                    f"SELECT 1 FROM {self.events_table_name}"
                    " WHERE originator_id = ? AND originator_version > ? LIMIT 1",
                    (key.hex, version),
                )
                if c.fetchone() is not None:
                    raise StreamsAdvanced("a stream this save depends on has moved on")
        views: ViewRows | None = kwargs.get("views")
        if views:  # the inline projections' rows, in this transaction
            apply_sqlite(c, views, list(ids or ()))
        return ids

    def create_table(self) -> None:
        super().create_table()
        with self.datastore.transaction(commit=True) as c:
            if not self._has_chain_column(c):
                c.execute(f"ALTER TABLE {self.events_table_name} ADD COLUMN chain_hash BLOB")
                self._chain_column = True

    _chain_column: bool | None = None

    def _has_chain_column(self, c: Any) -> bool:
        if self._chain_column is None:
            c.execute(f"PRAGMA table_info({self.events_table_name})")
            self._chain_column = any(row[1] == "chain_hash" for row in c.fetchall())
        return self._chain_column

    def _insert_rows(self, c: Any, stored_events: Sequence[StoredEvent]) -> list[int]:
        """The events with their chain hashes (docs/auditing.md) in the INSERT,
        so each row is written once: those storage/chains.py knows, and
        those whose previous is a stored row, read first in this transaction
        (it holds the write lock from its BEGIN: storage/sqlite_factory.py)."""
        if not self._has_chain_column(c):  # a store db init has not upgraded yet
            return list(super()._insert_events(c, stored_events) or ())
        hashes: list[bytes | None] = (known_chain_hashes(stored_events) if self.save_chains
                                      else [None] * len(stored_events))
        if self.save_chains and None in hashes:
            self._chain_from_stored(c, stored_events, hashes)
        ids = []
        for event, value in zip(stored_events, hashes, strict=True):
            key = event.originator_id
            c.execute(self._insert_chained, (
                key.hex if isinstance(key, uuid.UUID) else key, event.originator_version,
                event.topic, event.state, value,
            ))
            ids.append(int(c.lastrowid))
        return ids

    def _chain_from_stored(self, c: Any, stored_events: Sequence[StoredEvent],
                           hashes: list[bytes | None]) -> None:
        """Fills in ``hashes`` those whose previous is a stored row (a stream
        that goes on). An old row without a hash leaves the stream's new ones None."""
        made: dict[tuple[uuid.UUID, int], bytes | None] = {}
        for index, event in enumerate(stored_events):
            key, version = uuid.UUID(str(event.originator_id)), event.originator_version
            value = hashes[index]
            if value is None:
                if (key, version - 1) in made:
                    previous = made[(key, version - 1)]
                else:
                    c.execute(
                        f"SELECT chain_hash FROM {self.events_table_name}"
                        " WHERE originator_id = ? AND originator_version = ?",
                        (key.hex, version - 1),
                    )
                    row = c.fetchone()
                    previous = None if row is None or row[0] is None else bytes(row[0])
                value = hashes[index] = (
                    None if previous is None
                    else chain_hash(key, version, previous, event.topic, event.state)
                )
            made[(key, version)] = value


SQLITE_RECORDER_TOPIC = f"{__name__}:{KandevSQLiteRecorder.__name__}"
