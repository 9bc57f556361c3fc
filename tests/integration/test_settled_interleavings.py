"""The settled read against every commit order we can make on PostgreSQL
(docs/architecture.md: Ordering without a global lock): saves held open, committed or rolled
back in random order on several real connections, some taking their
transaction id long before they save, some drawing ids inside a savepoint they
roll back. A projection runner polling between the steps must apply exactly
the committed events, each once, in id order; and a notification sequence
made to cache ids per session (which would hand a later save a lower id than
one already read) is put back to one id at a time by ``db init``."""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

import psycopg
import pytest
from kandev_es.projections.base import event_topics
from kandev_es.projections.runner import ProjectionRunner
from psycopg import sql

from kandev_es.bootstrap import bootstrap
from kandev_es.domain.identity import Identity
from kandev_es.storage.database import Transaction

INSERT = (
    "SELECT kandev_insert_events(%b::uuid[], %b::bigint[], %b::text[], %b::bytea[],"
    " %b::uuid[], %b::bigint[])"
)
SEEDS = range(12)
STEPS = 60
WRITERS = 4


class Seen:
    """Records each applied event in its own table, in the runner's transaction:
    a second application of a position fails on the primary key."""

    name = "seen"
    topics = event_topics(Identity)

    def apply(self, tx: Transaction, event: Any, position: int, backend: str) -> None:
        tx.execute(
            "INSERT INTO seen_events (position, originator_id) VALUES (?, ?)",
            (position, str(event.originator_id)),
        )


def _seen(services: Any) -> list[tuple[int, str]]:
    with services.database.transaction() as tx:
        rows = tx.execute("SELECT position, originator_id FROM seen_events ORDER BY applied")
    return [(int(position), str(originator)) for position, originator in rows]


def _runner(services: Any) -> ProjectionRunner:
    with services.database.transaction() as tx:
        tx.execute(
            "CREATE TABLE seen_events (applied bigserial PRIMARY KEY,"
            " position bigint NOT NULL UNIQUE, originator_id text NOT NULL)"
        )
    # A batch of two: both the full-batch and the settled-position branch run.
    return ProjectionRunner(services.app, services.database, [Seen()], batch_size=2)


def _connect(settings: Any) -> psycopg.Connection[Any]:
    return psycopg.connect(settings.postgres.schema_conninfo)


def _save(app: Any, conn: psycopg.Connection[Any], workspace_id: uuid.UUID) -> tuple[str, int]:
    identity = Identity.register(uuid.uuid4(), workspace_id, f"X-{uuid.uuid4().hex[:8]}")
    stored = [app.mapper.to_stored_event(e) for e in identity.collect_events()]
    rows = conn.execute(
        INSERT,
        (
            [e.originator_id for e in stored],
            [e.originator_version for e in stored],
            [e.topic for e in stored],
            [e.state for e in stored],
            [],
            [],
        ),
    ).fetchall()
    assert len(rows) == 1
    return str(identity.id), int(rows[0][0])


class _Follower:
    """A reader following the log a moment behind, as the feed reader does
    (``Tasks.following_rows``: one statement a read, up to the position its
    checkpoints settled), here over the log itself, two rows a read."""

    LIMIT = 2

    def __init__(self, app: Any) -> None:
        self._app = app
        self._query = (
            f"SELECT notification_id, originator_id FROM {app.recorder.events_table_sql}"
            " WHERE notification_id > %(after)s AND notification_id <= b.bound"
            " ORDER BY notification_id LIMIT %(limit)s"
        )
        self.through = app.max_notification_id()  # the fixtures' saves, all committed
        self.seen: list[tuple[int, str]] = []

    def read(self) -> None:
        read = self._app.following_rows(
            self._query, {"after": self.through, "limit": self.LIMIT}, {}
        )
        found = sorted((int(position), str(originator)) for position, originator in read.rows)
        self.seen.extend(found)
        full = len(found) >= self.LIMIT
        self.through = max(self.through, found[-1][0] if full else read.bound)

    def catch_up(self, head: int) -> None:
        deadline = time.monotonic() + 30
        while self.through < head:
            assert time.monotonic() < deadline, (self.through, head)
            self.read()


def _assert_exactly_once_in_order(seen: list[tuple[int, str]], committed: dict[str, int]) -> None:
    positions = [position for position, _ in seen]
    assert positions == sorted(set(positions)), "applied twice or out of id order"
    assert dict((originator, position) for position, originator in seen) == committed


@pytest.mark.postgres_only
@pytest.mark.parametrize("seed", SEEDS)
def test_a_polling_runner_applies_exactly_the_committed_saves_once_in_order(
    services, settings, workspace, seed: int
) -> None:
    app = services.app
    runner = _runner(services)
    follower = _Follower(app)
    chance = random.Random(seed)
    writers = [_connect(settings) for _ in range(WRITERS)]
    pending: list[dict[str, int]] = [{} for _ in writers]
    committed: dict[str, int] = {}
    try:
        for _ in range(STEPS):
            index = chance.randrange(len(writers))
            conn, mine = writers[index], pending[index]
            step = chance.choice(
                ["xid", "save", "save", "savepoint", "commit", "rollback", "pool", "read", "read"]
            )
            if step == "xid":  # a transaction id taken long before the save
                conn.execute("SELECT pg_current_xact_id()")
            elif step == "save":
                originator, position = _save(app, conn, workspace.id)
                mine[originator] = position
            elif step == "savepoint":  # ids drawn in a subtransaction, kept or rolled back
                conn.execute("SAVEPOINT s")
                originator, position = _save(app, conn, workspace.id)
                if chance.random() < 0.5:
                    conn.execute("ROLLBACK TO SAVEPOINT s")
                else:
                    conn.execute("RELEASE SAVEPOINT s")
                    mine[originator] = position
            elif step == "commit":
                conn.commit()
                committed.update(mine)
                mine.clear()
            elif step == "rollback":
                conn.rollback()
                mine.clear()
            elif step == "pool":  # the service's own save: one autocommit statement
                identity = Identity.register(uuid.uuid4(), workspace.id, f"P-{uuid.uuid4()}")
                app.save(identity)
                committed[str(identity.id)] = app.max_notification_id()
            else:
                runner.run_once()
                for position, originator in _seen(services):
                    assert committed.get(originator) == position, "applied before it committed"
                follower.read()
                for position, originator in follower.seen:
                    assert committed.get(originator) == position, "followed before it committed"
        for index, conn in enumerate(writers):
            if chance.random() < 0.5:
                conn.commit()
                committed.update(pending[index])
            else:
                conn.rollback()
        runner.catch_up(timeout=30)
        follower.catch_up(app.max_notification_id())
    finally:
        for conn in writers:
            conn.close()
    _assert_exactly_once_in_order(_seen(services), committed)
    _assert_exactly_once_in_order(follower.seen, committed)


@pytest.mark.postgres_only
def test_db_init_makes_the_notification_sequence_hand_out_one_id_at_a_time(
    services, settings, workspace
) -> None:
    """With a per-session cache a session's next id can be far below an id
    another session committed and a reader already passed: that event would
    never be read. ``db init`` sets the cache back to 1."""
    recorder: Any = services.app.recorder
    table = f'"{recorder.datastore.schema}"."{recorder.events_table_name}"'
    with psycopg.connect(settings.postgres.conninfo, autocommit=True) as admin:
        row = admin.execute(
            "SELECT pg_get_serial_sequence(%s, 'notification_id')", (table,)
        ).fetchone()
        assert row is not None
        sequence = str(row[0])
        admin.execute(sql.SQL("ALTER SEQUENCE {} CACHE 20").format(sql.SQL(sequence)))
    bootstrap(settings).close()  # what `kandev-es db init` runs
    with psycopg.connect(settings.postgres.conninfo, autocommit=True) as admin:
        row = admin.execute(
            "SELECT seqcache FROM pg_sequence WHERE seqrelid = %s::regclass", (sequence,)
        ).fetchone()
    assert row == (1,)

    runner = _runner(services)
    early, late = _connect(settings), _connect(settings)
    committed: dict[str, int] = {}
    try:
        for conn in (early, late, early):  # the early session saves again after late's
            originator, position = _save(services.app, conn, workspace.id)
            conn.commit()
            committed[originator] = position
            runner.catch_up(timeout=30)
    finally:
        early.close()
        late.close()
    _assert_exactly_once_in_order(_seen(services), committed)


@pytest.mark.postgres_only
def test_a_save_that_took_its_id_after_the_last_completed_one_holds_the_followers_back(
    services, settings, workspace
) -> None:
    """A (transaction id first) and B (next id) both save, B's event drawn
    between A's two draws; A commits, B is still open. The snapshot's xmax is
    then A's id + 1 = B's id, and xmin is B's id: a checkpoint whose U were
    that xmax would settle at once, and B's event, committed later, would be
    passed for good by a reader and by the projection loop's settled read."""
    app = services.app
    follower = _Follower(app)
    a, b = _connect(settings), _connect(settings)
    try:
        a.execute("SELECT pg_current_xact_id()")
        b.execute("SELECT pg_current_xact_id()")
        first_a, _ = _save(app, a, workspace.id)
        late_b, position_b = _save(app, b, workspace.id)
        second_a, _ = _save(app, a, workspace.id)
        a.commit()
        for _ in range(3):  # checkpoints taken and looked at while B is open
            follower.read()
            app.recorder.checkpoint()
            app.recorder.read_settled(follower.through, 100)
        assert follower.through < position_b, "passed a save still open"
        settled = app.recorder.read_settled(0, 10_000).position
        assert settled < position_b, "the loop's settled read passed a save still open"
        b.commit()
        follower.catch_up(app.max_notification_id())
    finally:
        a.close()
        b.close()
    assert [originator for _, originator in follower.seen] == [first_a, late_b, second_a]
