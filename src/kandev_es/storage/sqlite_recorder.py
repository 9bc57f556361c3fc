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

from kandev_es.storage.settled import Settled
from kandev_es.storage.streams import Since, StreamsAdvanced, Versions
from kandev_es.storage.view_writes import ViewRows, apply_sqlite


class KandevSQLiteRecorder(SQLiteApplicationRecorder):
    def next_office_number(self, workspace_id: uuid.UUID) -> int:
        with self.datastore.transaction(commit=True) as c:
            c.execute(
                "INSERT INTO office_counters (workspace_id, last_value) VALUES (?, 1)"
                " ON CONFLICT (workspace_id) DO UPDATE SET last_value = last_value + 1"
                " RETURNING last_value",
                (str(workspace_id),),
            )
            return int(c.fetchone()[0])

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

    def select_streams(self, since: Since) -> list[StoredEvent]:
        one = (
            f"SELECT originator_id, originator_version, topic, state"
            f" FROM {self.events_table_name} WHERE originator_id = ? AND originator_version > ?"
        )
        statement = " UNION ALL ".join([one] * len(since))
        params = [p for key, version in since for p in (key.hex, version)]
        with self.datastore.transaction(commit=False) as c:
            c.execute(statement, params)
            rows = c.fetchall()
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

    def _insert_events(self, c: Any, stored_events: Sequence[StoredEvent],
                       **kwargs: Any) -> Sequence[int] | None:
        ids = super()._insert_events(c, stored_events, **kwargs)
        unchanged: Versions | None = kwargs.get("unchanged")
        if unchanged:
            # The insert took the write lock, so this sees every committed write;
            # raising here rolls the transaction back.
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


SQLITE_RECORDER_TOPIC = f"{__name__}:{KandevSQLiteRecorder.__name__}"
