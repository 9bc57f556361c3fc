"""The webhook tables: subscriptions (each a cursor on its workspace's feed),
the delivery log, and the deliveries counted by result.

Tables, not events: a subscription's cursor and attempt count change with
every delivery (several writes a second under load), which as events would
grow the event store and the tamper-evident log by more than the tasks they
report; its secret must stay readable to sign (so it cannot be hashed like a
token) and must be gone for good once deleted or rotated out, which an
append-only log cannot promise. Whoever reads the database reads the
secrets, as with every webhook sender; the delivery log keeps no body.
"""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

from kandev_es.storage.database import Database, Transaction

ACTIVE, PAUSED, DISABLED = "active", "paused", "disabled"
LOG_KEPT = 100  # delivery-log rows kept per subscription

_COLUMNS = (
    "id, workspace_id, url, event_types, description, secret, old_secret, old_secret_until,"
    " state, reason, cursor, attempts, next_attempt_at, generation, created_at, updated_at"
)


def ddl(backend: str) -> tuple[str, ...]:
    uid = "UUID" if backend == "postgres" else "TEXT"
    real = "DOUBLE PRECISION" if backend == "postgres" else "REAL"
    serial = (
        "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
        if backend == "postgres"
        else "INTEGER PRIMARY KEY AUTOINCREMENT"
    )
    return (
        "CREATE TABLE IF NOT EXISTS webhook_subscriptions ("
        f" id {uid} PRIMARY KEY, workspace_id {uid} NOT NULL, url TEXT NOT NULL,"
        " event_types TEXT NOT NULL, description TEXT NOT NULL, secret TEXT NOT NULL,"
        f" old_secret TEXT, old_secret_until {real}, state TEXT NOT NULL, reason TEXT,"
        " cursor BIGINT NOT NULL, attempts INTEGER NOT NULL,"
        f" next_attempt_at {real} NOT NULL, generation INTEGER NOT NULL,"
        f" created_at {real} NOT NULL, updated_at {real} NOT NULL)",
        "CREATE INDEX IF NOT EXISTS webhook_subscriptions_workspace"
        " ON webhook_subscriptions (workspace_id, created_at)",
        "CREATE TABLE IF NOT EXISTS webhook_deliveries ("
        f" id {serial}, subscription_id {uid} NOT NULL, position BIGINT NOT NULL,"
        f" event_id TEXT NOT NULL, attempt INTEGER NOT NULL, at {real} NOT NULL,"
        f" result TEXT NOT NULL, status INTEGER, latency_ms {real} NOT NULL,"
        f" snippet TEXT NOT NULL, next_attempt_at {real}, request_id TEXT NOT NULL)",
        "CREATE INDEX IF NOT EXISTS webhook_deliveries_subscription"
        " ON webhook_deliveries (subscription_id, id)",
        "CREATE TABLE IF NOT EXISTS webhook_counters (result TEXT PRIMARY KEY,"
        " count BIGINT NOT NULL)",
    )


def create_tables(database: Database) -> None:
    with database.transaction() as tx:
        for statement in ddl(database.backend):
            tx.execute(statement)


@dataclass(frozen=True)
class Subscription:
    id: uuid.UUID
    workspace_id: uuid.UUID
    url: str
    event_types: tuple[str, ...]
    description: str
    secret: str
    old_secret: str | None
    old_secret_until: float | None
    state: str
    reason: str | None
    cursor: int
    attempts: int
    next_attempt_at: float
    generation: int
    created_at: float
    updated_at: float

    def secrets_in_use(self, now: float) -> list[str]:
        """The secrets that sign now: the current one, and a rotated-out one
        until its overlap ends."""
        if self.old_secret and self.old_secret_until and now < self.old_secret_until:
            return [self.secret, self.old_secret]
        return [self.secret]


def _subscription(row: tuple[Any, ...]) -> Subscription:
    (
        sid,
        workspace,
        url,
        types,
        description,
        secret,
        old,
        until,
        state,
        reason,
        cursor,
        attempts,
        next_at,
        generation,
        created,
        updated,
    ) = row
    return Subscription(
        uuid.UUID(str(sid)),
        uuid.UUID(str(workspace)),
        url,
        tuple(types.split(",")),
        description,
        secret,
        old,
        until,
        state,
        reason,
        int(cursor),
        int(attempts),
        float(next_at),
        int(generation),
        float(created),
        float(updated),
    )


class SubscriptionStore:
    """Rows of the webhook tables; every write is one short transaction."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self._postgres = database.backend == "postgres"

    def _id(self, value: uuid.UUID) -> Any:
        return value if self._postgres else str(value)

    def insert(self, subscription: Subscription) -> None:
        s = subscription
        with self.database.transaction() as tx:
            tx.execute(
                f"INSERT INTO webhook_subscriptions ({_COLUMNS})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    self._id(s.id),
                    self._id(s.workspace_id),
                    s.url,
                    ",".join(s.event_types),
                    s.description,
                    s.secret,
                    s.old_secret,
                    s.old_secret_until,
                    s.state,
                    s.reason,
                    s.cursor,
                    s.attempts,
                    s.next_attempt_at,
                    s.generation,
                    s.created_at,
                    s.updated_at,
                ),
            )

    def count(self, workspace_id: uuid.UUID) -> int:
        rows = self.database.read(
            "SELECT count(*) FROM webhook_subscriptions WHERE workspace_id = ?",
            (self._id(workspace_id),),
        )
        return int(rows[0][0])

    def get(self, subscription_id: uuid.UUID) -> Subscription | None:
        rows = self.database.read(
            f"SELECT {_COLUMNS} FROM webhook_subscriptions WHERE id = ?",
            (self._id(subscription_id),),
        )
        return _subscription(rows[0]) if rows else None

    def of_workspace(self, workspace_id: uuid.UUID) -> list[Subscription]:
        rows = self.database.read(
            f"SELECT {_COLUMNS} FROM webhook_subscriptions WHERE workspace_id = ?"
            " ORDER BY created_at, id",
            (self._id(workspace_id),),
        )
        return [_subscription(row) for row in rows]

    def all(self, state: str | None = None) -> list[Subscription]:
        where, params = ("WHERE state = ?", (state,)) if state else ("", ())
        rows = self.database.read(
            f"SELECT {_COLUMNS} FROM webhook_subscriptions {where} ORDER BY created_at, id",
            params,
        )
        return [_subscription(row) for row in rows]

    def update(self, subscription_id: uuid.UUID, **changes: Any) -> Subscription | None:
        """Set ``changes`` (column names of this module, never caller input)
        and bump the generation, so a delivery under way does not move the
        cursor it read before (``advance``'s guard)."""
        assignments = ", ".join(f"{name} = ?" for name in changes)
        with self.database.transaction() as tx:
            rows = tx.execute(
                f"UPDATE webhook_subscriptions SET {assignments}, updated_at = ?,"
                " generation = generation + 1 WHERE id = ? RETURNING id",
                (*changes.values(), time.time(), self._id(subscription_id)),
            )
        return self.get(subscription_id) if rows else None

    def delete(self, subscription_id: uuid.UUID) -> bool:
        with self.database.transaction() as tx:
            rows = tx.execute(
                "DELETE FROM webhook_subscriptions WHERE id = ? RETURNING id",
                (self._id(subscription_id),),
            )
            tx.execute(
                "DELETE FROM webhook_deliveries WHERE subscription_id = ?",
                (self._id(subscription_id),),
            )
        return bool(rows)

    def drop_expired_secrets(self, now: float) -> None:
        """Rotated-out secrets whose overlap has ended: gone from the store."""
        with self.database.transaction() as tx:
            tx.execute(
                "UPDATE webhook_subscriptions SET old_secret = NULL, old_secret_until = NULL"
                " WHERE old_secret IS NOT NULL AND old_secret_until < ?",
                (now,),
            )

    def delete_workspace(self, workspace_id: uuid.UUID) -> int:
        """Every subscription of a deleted workspace, with its log: how many."""
        with self.database.transaction() as tx:
            gone = tx.execute(
                "DELETE FROM webhook_subscriptions WHERE workspace_id = ? RETURNING id",
                (self._id(workspace_id),),
            )
            tx.executemany(
                "DELETE FROM webhook_deliveries WHERE subscription_id = ?", [(g[0],) for g in gone]
            )
        return len(gone)

    def record(
        self, guard: Subscription | None, attempts: list[Attempt], changes: dict[str, Any]
    ) -> bool:
        """Delivery attempts: their log rows, their results counted, and (only
        if nobody paused, replayed or deleted the subscription since ``guard``
        was read or written: its cursor and generation) its ``changes``, in
        one transaction; whether the changes were made."""
        with self.database.transaction() as tx:
            moved = False
            if guard is not None and changes:
                assignments = ", ".join(f"{name} = ?" for name in changes)
                moved = bool(
                    tx.execute(
                        f"UPDATE webhook_subscriptions SET {assignments}"
                        " WHERE id = ? AND cursor = ? AND generation = ? RETURNING id",
                        (*changes.values(), self._id(guard.id), guard.cursor, guard.generation),
                    )
                )
            if attempts:
                self._log(tx, attempts)
        return moved

    def _log(self, tx: Transaction, attempts: list[Attempt]) -> None:
        tx.executemany(
            "INSERT INTO webhook_deliveries (subscription_id, position, event_id, attempt, at,"
            " result, status, latency_ms, snippet, next_attempt_at, request_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    self._id(a.subscription_id),
                    a.position,
                    a.event_id,
                    a.attempt,
                    a.at,
                    a.result,
                    a.status,
                    a.latency_ms,
                    a.snippet,
                    a.next_attempt_at,
                    a.request_id,
                )
                for a in attempts
            ],
        )
        results = Counter(a.result for a in attempts)
        tx.executemany(
            "INSERT INTO webhook_counters (result, count) VALUES (?, ?)"
            " ON CONFLICT (result) DO UPDATE SET count = webhook_counters.count + excluded.count",
            sorted(results.items()),
        )
        for sid in {a.subscription_id for a in attempts}:
            if random.random() < len(attempts) / 20:  # now and then: keep the latest LOG_KEPT
                tx.execute(
                    "DELETE FROM webhook_deliveries WHERE subscription_id = ? AND id <"
                    " (SELECT min(id) FROM (SELECT id FROM webhook_deliveries"
                    "  WHERE subscription_id = ? ORDER BY id DESC LIMIT ?) AS kept)",
                    (self._id(sid), self._id(sid), LOG_KEPT),
                )

    def deliveries(self, subscription_id: uuid.UUID, limit: int) -> list[Attempt]:
        rows = self.database.read(
            "SELECT position, event_id, attempt, at, result, status, latency_ms, snippet,"
            " next_attempt_at, request_id FROM webhook_deliveries"
            " WHERE subscription_id = ? ORDER BY id DESC LIMIT ?",
            (self._id(subscription_id), limit),
        )
        return [
            Attempt(
                subscription_id,
                int(r[0]),
                str(r[1]),
                int(r[2]),
                float(r[3]),
                str(r[4]),
                None if r[5] is None else int(r[5]),
                float(r[6]),
                str(r[7]),
                None if r[8] is None else float(r[8]),
                str(r[9]),
            )
            for r in rows
        ]

    def counters(self) -> dict[str, int]:
        rows = self.database.read("SELECT result, count FROM webhook_counters")
        return {str(result): int(count) for result, count in rows}

    def oldest_pending(self, s: Subscription) -> str | None:
        """The timestamp of the first feed event past the cursor (None: none)."""
        rows = self.database.read(
            "SELECT timestamp FROM feed_events WHERE workspace_id = ? AND position > ?"
            " ORDER BY position LIMIT 1",
            (self._id(s.workspace_id), s.cursor),
        )
        return str(rows[0][0]) if rows else None

    def feed_head(self, workspace_id: uuid.UUID) -> int:
        rows = self.database.read(
            "SELECT coalesce(max(position), 0) FROM feed_events WHERE workspace_id = ?",
            (self._id(workspace_id),),
        )
        return int(rows[0][0])


@dataclass(frozen=True)
class Attempt:
    """One delivery attempt as the log keeps it: no body, no header."""

    subscription_id: uuid.UUID
    position: int
    event_id: str
    attempt: int
    at: float
    result: str
    status: int | None
    latency_ms: float
    snippet: str
    next_attempt_at: float | None
    request_id: str
