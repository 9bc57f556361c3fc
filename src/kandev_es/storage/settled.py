"""Reading the PostgreSQL notification log without a global write lock
(docs/architecture.md: "Ordering without a global lock").

Saves commit in parallel, so notification ids can become visible out of
order: a save that drew id 100 may commit after one that drew id 101. A
reader that tracks its position by the last id it saw must never move past
an id that may still appear. This module finds how far that is safe.

- Every save draws its ids only after its transaction has an id (the column
  default in ``recorders.UPGRADE``), so a transaction that drew an id has a
  lower transaction id than any transaction id assigned after the draw.
- A **checkpoint** (L, U): L is the highest id visible in one statement's
  snapshot, U above every transaction id assigned when it was taken
  (``CHECKPOINT_XMAX``: PostgreSQL's next transaction id as the statement
  runs; the snapshot's xmax alone is the latest completed id + 1, and a later
  save can run at or above it). Every id <= L was drawn before
  L was (ids are drawn one at a time, in time order), so before that
  snapshot, by a transaction that already had its id: one below U. Taking a checkpoint
  assigns no transaction id, so it writes nothing (no WAL flush, no commit).
- Once a later statement's ``pg_snapshot_xmin(pg_current_snapshot())`` is
  >= U, every transaction below U has ended (PostgreSQL: ids below xmin are
  committed and visible, or rolled back), so every id <= L that will ever
  exist is visible in that statement: L is **settled**. The read returns
  rows up to the highest settled L only, in that same statement, so what
  it returns and what it judges settled come from one snapshot.
- Every such row has ``transaction_id`` < xmin already, so the read does not
  filter on the column: after a logical restore (pg_dump into another
  cluster) the stored transaction ids come from the old cluster, and such a
  filter would hide every restored event, for good.

A checkpoint is a process-wide fact, so one ``Horizon`` per recorder serves
every reader in the process. A long open write transaction anywhere in the
cluster holds the horizon back (readers wait), never lets one skip.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eventsourcing.persistence import Notification

MAX_PENDING = 16
# A checkpoint's U: above every transaction id assigned before its snapshot.
# The snapshot's xmax alone is not: it is the latest *completed* id + 1, so a
# save that took its id after another's and is still running can lie at or
# above it (then no xmin ever waits for it, and an id it drew below L, to
# commit later, would be passed for good). PostgreSQL's next id, read while
# the statement runs (after its snapshot), is: ``age(xid)`` is that id minus
# ``xid`` in a statement that has no id of its own (GetStableLatestTransactionId).
# Read with psycopg's parameters (%% for %).
CHECKPOINT_XMAX = (
    "(pg_snapshot_xmax(pg_current_snapshot())::text::bigint + greatest(0, age(("
    "pg_snapshot_xmax(pg_current_snapshot())::text::bigint %% 4294967296)::text::xid)))"
    "::text::xid8"
)


@dataclass(frozen=True)
class Settled:
    """Notifications after a position, all of them at or below ``position``:
    every id <= ``position`` that will ever commit has committed."""

    notifications: list[Notification]
    position: int


@dataclass(frozen=True)
class Followed:
    """A following read (``Horizon.following_sql``): the query's rows up to
    ``bound`` (settled), the log's head ``top``, and whether a watched
    aggregate has an event after the version given (``moved``)."""

    rows: list[Sequence[Any]]
    bound: int
    top: int
    moved: bool


class Horizon:
    """The settled position and the checkpoints that may move it on."""

    def __init__(self, table_sql: str) -> None:
        self._lock = threading.Lock()
        self._floor = 0  # every id <= floor is settled
        self._pending: list[tuple[int, int]] = []  # (L, U), both increasing
        self._table_sql = table_sql
        self.checkpoint_sql = (
            f"SELECT coalesce(max(notification_id), 0),"
            f" CASE WHEN coalesce(max(notification_id), 0) > %s"
            f" THEN {CHECKPOINT_XMAX}::text END FROM {table_sql}"
        )
        self._read_sql: dict[bool, str] = {
            filtered: self._read_statement(table_sql, filtered) for filtered in (False, True)
        }

    @staticmethod
    def _read_statement(table_sql: str, filtered: bool) -> str:
        topics = " AND topic = ANY(%(topics)s)" if filtered else ""
        return (
            "WITH horizon AS (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS xmin),"
            " settled AS (SELECT h.xmin, greatest(%(floor)s::bigint,"
            "  (SELECT max(c.l) FROM unnest(%(ls)s::bigint[], %(us)s::text[]::xid8[]) AS c(l, u)"
            "   WHERE c.u <= h.xmin)) AS bound FROM horizon h)"
            " SELECT s.xmin::text, s.bound, e.notification_id, e.originator_id,"
            "  e.originator_version, e.topic, e.state"
            " FROM settled s LEFT JOIN LATERAL ("
            "  SELECT notification_id, originator_id, originator_version, topic, state"
            f"  FROM {table_sql} WHERE notification_id > %(after)s"
            "   AND notification_id <= s.bound"
            f"{topics} ORDER BY notification_id LIMIT %(limit)s) e ON true"
            " ORDER BY e.notification_id"
        )

    def known(self) -> int:
        """The highest L of any checkpoint (or the floor): a new checkpoint
        is only worth a transaction id when the head is beyond it."""
        with self._lock:
            return self._known_locked()

    def _known_locked(self) -> int:
        return max([self._floor, *(upto for upto, _ in self._pending)])

    def add(self, head: int, xid: int) -> None:
        with self._lock:
            if head <= self._known_locked():
                return
            if len(self._pending) >= MAX_PENDING:
                # The oldest checkpoints settle first; a newer one only
                # settles after them, so replacing the newest loses nothing.
                self._pending.pop()
            self._pending.append((head, xid))

    def read_params(
        self, after: int, limit: int, topics: Sequence[str]
    ) -> tuple[str, dict[str, Any]]:
        with self._lock:
            pending = list(self._pending)
            floor = self._floor
        params: dict[str, Any] = {
            "floor": floor,
            "ls": [upto for upto, _ in pending],
            "us": [str(u) for _, u in pending],
            "after": after,
            "limit": limit,
            "topics": list(topics),
        }
        return self._read_sql[bool(topics)], params

    def following_sql(self, query: str) -> str:
        """One statement for a reader that follows the log (the feed reader,
        services/fanout.py): ``query``'s rows up to the settled position as
        this statement finds it (``b.bound`` in ``query``), that position, the
        log's head, and a checkpoint of this same snapshot (its head and
        xmax), which a later statement settles. Nothing but the snapshot and
        the log's index is read (no pg_locks): a reader passing every few
        milliseconds costs one small statement a pass. Also,
        in the same snapshot, whether any of the aggregates ``%(watched)s``
        has an event after its version in ``%(versions)s`` (``moved``: the
        reader's followers' tokens and workspaces, checked again only then)."""
        return (
            "WITH s AS MATERIALIZED (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS xmin,"
            f"  {CHECKPOINT_XMAX} AS xmax,"
            f"  (SELECT coalesce(max(notification_id), 0) FROM {self._table_sql}) AS top),"
            " b AS MATERIALIZED (SELECT s.xmin, s.xmax, s.top, greatest(%(floor)s::bigint,"
            "  (SELECT max(c.l) FROM unnest(%(ls)s::bigint[], %(us)s::text[]::xid8[]) AS c(l, u)"
            "   WHERE c.u <= s.xmin)) AS bound,"
            "  EXISTS (SELECT FROM unnest(%(watched)s::uuid[], %(versions)s::bigint[]) AS w(id, v)"
            f"   WHERE (SELECT e.originator_version FROM {self._table_sql} e"
            "    WHERE e.originator_id = w.id ORDER BY e.originator_version DESC LIMIT 1)"
            "   > w.v) AS moved FROM s)"
            " SELECT b.xmin::text, b.bound, b.top, b.xmax::text, b.moved, q.*"
            f" FROM b LEFT JOIN LATERAL ({query}) q ON true"
        )

    def following_params(
        self, params: dict[str, Any], watched: Mapping[uuid.UUID, int]
    ) -> dict[str, Any]:
        with self._lock:
            pending = list(self._pending)
            floor = self._floor
        return {
            **params,
            "floor": floor,
            "ls": [upto for upto, _ in pending],
            "us": [str(u) for _, u in pending],
            "watched": list(watched),
            "versions": list(watched.values()),
        }

    def followed(self, rows: Sequence[Sequence[Any]]) -> Followed:
        """What a ``following_sql`` statement found: remembers what settled
        and the checkpoint it took."""
        xmin, bound, top, xmax, moved = rows[0][:5]
        self._advance(int(xmin), int(bound))
        self.add(int(top), int(xmax))
        return Followed(
            [row[5:] for row in rows if row[5] is not None], int(bound), int(top), bool(moved)
        )

    def raise_floor(self, position: int) -> None:
        """``position`` is settled (another reader proved it: ``Writers``)."""
        with self._lock:
            if position > self._floor:
                self._floor = position
                self._pending = [(upto, xid) for upto, xid in self._pending if upto > position]

    def _advance(self, xmin: int, bound: int) -> None:
        with self._lock:
            self._floor = max(self._floor, bound)
            self._pending = [
                (upto, xid) for upto, xid in self._pending if xid > xmin and upto > self._floor
            ]

    def settle(self, rows: Sequence[tuple[Any, ...]]) -> Settled:
        """Turn the read's rows into notifications and remember what settled."""
        xmin, bound = int(rows[0][0]), int(rows[0][1])
        self._advance(xmin, bound)
        # psycopg already loads the uuid column as UUID: no round trip through
        # str (a tenth of a projection pass's Python calls).
        notifications = [
            Notification(
                id=int(notification_id),
                originator_id=(
                    originator_id
                    if isinstance(originator_id, uuid.UUID)
                    else uuid.UUID(str(originator_id))
                ),
                originator_version=int(originator_version),
                topic=str(topic),
                state=bytes(state),
            )
            for _, _, notification_id, originator_id, originator_version, topic, state in rows
            if notification_id is not None
        ]
        return Settled(notifications, bound)


class Writers:
    """The settled head for readers of rows written inline (the feeds), by
    the saves under way on this events table only -- a long transaction
    elsewhere in the cluster (another database, a backup) holds the xmin of
    ``Horizon`` back, but not this.

    Every save inserts into the events table, and so holds its ROW EXCLUSIVE
    lock from before it draws an id until it ends, and has a transaction id
    before it draws (the column defaults). In one statement (``head_sql``):
    H, the highest id visible, and W, the transaction ids of the
    transactions holding that lock (granted; subtransactions' ids too, the
    top-level one among them). An id <= H not visible then was drawn before
    H was, by a save under way then: one in W, or one that ended between the
    snapshot and the lock scan (visible to any later statement). A holder
    without a transaction id at the scan has drawn nothing, and will draw
    above H; so has a save still waiting for the lock.

    A later statement (``settled_sql``) whose own snapshot has every one of
    W ended (``pg_visible_in_snapshot``) sees every id <= H that will ever exist:
    it returns its rows up to H in that same snapshot, or none and
    ``settled`` false, to be asked again a moment later. So a read under way
    saves takes two statements, each one round trip."""

    def __init__(self, table_sql: str) -> None:
        # pg_locks names a transaction by its 32-bit id; within 2^31 of this
        # snapshot's xmax (as every running transaction is), it is the full
        # id nearest to xmax with the same low 32 bits.
        self.head_sql = (
            "WITH l AS MATERIALIZED (SELECT locktype, relation, database, mode, granted, pid,"
            "  virtualtransaction, transactionid FROM pg_locks"
            "  WHERE locktype IN ('relation', 'transactionid')),"
            " r AS (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS x)"
            f" SELECT (SELECT coalesce(max(notification_id), 0) FROM {table_sql}),"
            " ARRAY(SELECT DISTINCT r.x"
            "  + ((t.transactionid::text::bigint - r.x %% 4294967296 + 6442450944)"
            "  %% 4294967296) - 2147483648"
            "  FROM r, l JOIN l t"
            "  ON t.virtualtransaction = l.virtualtransaction AND t.locktype = 'transactionid'"
            "  AND t.granted"
            "  WHERE l.locktype = 'relation' AND l.relation = %s::regclass"
            "  AND l.database = (SELECT oid FROM pg_database"
            "   WHERE datname = current_database())"
            "  AND l.mode = 'RowExclusiveLock' AND l.granted AND l.pid <> pg_backend_pid())"
        )

    @staticmethod
    def settled_sql(query: str) -> str:
        """``query`` (rows up to ``%(upto)s``) gated on every one of
        ``%(writing)s`` (W, full transaction ids) having ended as its own
        snapshot sees it (below xmax, not in progress; a subtransaction's
        id may look ended early, but its top-level id is in W too):
        (settled, *row) rows, one (False, NULL...) row when not settled."""
        return (
            "WITH s AS (SELECT NOT EXISTS (SELECT FROM unnest(%(writing)s::bigint[]) w"
            "  WHERE NOT pg_visible_in_snapshot(w::text::xid8, pg_current_snapshot())) AS settled)"
            f" SELECT s.settled, q.* FROM s LEFT JOIN LATERAL (SELECT * FROM ({query}) q0"
            " WHERE s.settled) q ON true ORDER BY 2"
        )
