"""The supervised projection loop: polling on SQLite, LISTEN/NOTIFY on
PostgreSQL with the timed poll as fallback, and catch-up without loss or
duplicates after its LISTEN connection is killed."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from kandev_es.projections.feeds import FeedsProjection
from kandev_es.projections.rebuild import NEXT, _create_next
from kandev_es.projections.runner import ProjectionRunner
from kandev_es.projections.wakeup import PollWaker, PostgresListener

from tests.conftest import postgres_admin_url
from tests.integration.helpers import TASK_CREATED_SOURCES, create


def _feed_rows(services, table="feed_events"):
    with services.database.transaction() as tx:
        return tx.execute(f"SELECT position, event_id, subject FROM {table} ORDER BY position")


class _LoopFeeds(FeedsProjection):
    """The feeds as the loop applies them (a rebuild's replay), into ``_next``
    tables: the live ones are written inline by the saves."""

    name = "feeds-loop"
    inline = False


def _loop_runner(services) -> ProjectionRunner:
    with services.database.transaction() as tx:
        for table in FeedsProjection.tables:
            _create_next(tx, services.database.backend, table)
    return ProjectionRunner(services.app, services.database, [_LoopFeeds(NEXT)])


def _activated_positions(services):
    return [
        n.id
        for n in services.app.recorder.select_notifications(start=1, limit=1_000_000)
        if n.topic.endswith(TASK_CREATED_SOURCES)
    ]


def _wait_until(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_background_runner_catches_up_by_itself(client, services, member):
    _, secret = member
    runner = _loop_runner(services)
    thread = runner.start_thread(poll_seconds=0.05)
    try:
        for i in range(5):
            create(client, secret, external_id=f"B-{i}", title=f"t{i}")
        assert _wait_until(lambda: len(_feed_rows(services, "feed_events_next")) == 5, 10)
        assert _wait_until(lambda: set(runner.lag().values()) == {0}, 10)
    finally:
        runner.stop()
        thread.join(5)
    expected = PostgresListener if services.database.backend == "postgres" else PollWaker
    assert isinstance(runner.waker, expected)


@pytest.mark.postgres_only
def test_killed_listen_connection_loses_and_duplicates_nothing(client, services, member):
    _, secret = member
    runner = _loop_runner(services)
    # A poll this long means only NOTIFY (or a reconnect pass) can wake the
    # runner within the test's deadlines.
    thread = runner.start_thread(poll_seconds=60)
    created: list[str] = []
    try:
        assert _wait_until(lambda: getattr(runner.waker, "backend_pid", None) is not None, 10)

        kills: list[int] = []

        def kill_listener(admin) -> None:
            pid = runner.waker.backend_pid
            if admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]:
                kills.append(pid)
            _wait_until(lambda: runner.waker.backend_pid not in (None, pid), 10)

        def creates() -> None:
            with psycopg.connect(postgres_admin_url(), autocommit=True) as admin:
                for i in range(40):
                    if i % 10 == 5:
                        kill_listener(admin)
                    answer = create(client, secret, external_id=f"K-{i}", title=f"k{i}")
                    assert answer.json["outcome"] == "created"
                    created.append(answer.json["id"])

        writer = threading.Thread(target=creates)
        writer.start()
        writer.join(60)
        assert len(kills) == 4
        assert len(created) == 40
        assert _wait_until(lambda: len(_feed_rows(services, "feed_events_next")) == 40, 20)
        assert runner.waker.connects == 5

        # After the reconnects a NOTIFY still wakes the runner promptly.
        late = create(client, secret, external_id="K-late", title="late").json
        assert _wait_until(lambda: len(_feed_rows(services, "feed_events_next")) == 41, 5)
    finally:
        runner.stop()
        thread.join(5)
    rows = _feed_rows(services, "feed_events_next")
    assert [str(subject) for _, _, subject in rows] == [*created, late["id"]]
    assert len({event_id for _, event_id, _ in rows}) == len(rows) == 41
    assert [position for position, _, _ in rows] == _activated_positions(services)
    assert set(runner.lag().values()) == {0}


class _Poisoned:
    name = "poisoned"

    def apply(self, tx, event, position, backend):
        raise RuntimeError("bad projection")


def test_a_failing_projection_does_not_hold_back_the_others(client, services, member):
    from kandev_es.projections.feeds import FeedsProjection
    from kandev_es.projections.runner import ProjectionRunner

    _, secret = member
    create(client, secret, external_id="P-1", title="t")
    runner = ProjectionRunner(services.app, services.database, [_Poisoned(), FeedsProjection()])
    # A pass may stop below events whose ids an older open transaction (any test's,
    # in this shared cluster) could still precede: pass again until both have read.
    deadline = time.monotonic() + 30
    runner.run_once(raise_errors=False)
    while runner.lag()["feeds"] or "poisoned" not in runner.failures:
        assert time.monotonic() < deadline, runner.failures
        runner.run_once(raise_errors=False)
    assert set(runner.failures) == {"poisoned"}
    assert len(_feed_rows(services)) == 1
    assert runner.lag()["feeds"] == 0 and runner.lag()["poisoned"] > 0
    with pytest.raises(RuntimeError, match="bad projection"):
        runner.catch_up()


@pytest.mark.postgres_only
def test_runner_catches_up_after_the_database_restarts_under_load(tmp_path, backend, cluster_dir):
    """A private cluster, restarted while creates are flowing: the runner
    reconnects and every completed creation reaches the feed exactly once."""
    from kandev_es.api import create_app
    from kandev_es.bootstrap import bootstrap
    from kandev_es.config import Settings
    from tests.support.postgres import start_cluster

    cluster = start_cluster(cluster_dir / "pg")
    services = bootstrap(Settings(data_dir=tmp_path / "data", database_url=cluster.url))
    try:
        workspace = services.workspaces.open("restart")
        secret, _ = services.tokens.issue(workspace_id=workspace.id, admin=False)
        client = create_app(services=services, run_projections=False).test_client()
        thread = services.projections.start_thread(poll_seconds=0.2)
        ids: set[str] = set()

        def create_until_answered(i: int) -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                answer = create(client, secret, external_id=f"RS-{i}", title=f"r{i}")
                if answer.status_code == 200:
                    ids.add(answer.json["id"])
                    return
                time.sleep(0.1)
            raise AssertionError(f"create RS-{i} never answered")

        writer = threading.Thread(target=lambda: [create_until_answered(i) for i in range(25)])
        writer.start()
        assert _wait_until(lambda: len(ids) >= 8, 30)
        cluster.restart()  # while the writer keeps creating
        writer.join(90)
        assert len(ids) == 25
        # Ground truth: every Task.Activated in the store (a create cut by the
        # restart may be left preparing for the Runtime; it is not in the feed).
        completed = _activated_positions(services)
        assert len(completed) >= 20
        try:
            assert _wait_until(lambda: len(_feed_rows(services)) == len(completed), 30)
        finally:
            services.projections.stop()
            thread.join(5)
        rows = _feed_rows(services)
        assert [position for position, _, _ in rows] == completed
        assert len({str(subject) for _, _, subject in rows}) == len(rows)
        assert {str(subject) for _, _, subject in rows} <= ids
    finally:
        services.close()
        cluster.stop()


@pytest.mark.postgres_only
def test_an_idle_pass_neither_locks_nor_writes_a_tracking_row(client, services, member):
    """Once caught up, a pass with nothing new takes no row lock (a lock gives
    the transaction an id, so each idle pass of each runner would end in a WAL
    flush); the next event is still applied once, by a pass that does lock."""
    _, secret = member
    runner = _loop_runner(services)
    create(client, secret, external_id="IDLE-1", title="first")
    runner.catch_up()

    def tracking():
        with services.database.transaction() as tx:
            return dict(
                tx.execute("SELECT name, xmax::text FROM projection_tracking ORDER BY name")
            )

    before = tracking()
    assert set(before) >= {p.name for p in runner.projections}
    assert runner.run_once() == 0
    assert tracking() == before
    create(client, secret, external_id="IDLE-2", title="second")
    # Settling waits for every transaction open in the cluster (other test
    # workers share it), so a first pass may still find nothing settled.
    assert _wait_until(lambda: runner.run_once() > 0, 30)
    assert tracking() != before
    assert len(_feed_rows(services, "feed_events_next")) == 2


class _WritesWhileApplied:
    """Saves one more event for every batch it applies, up to ``cap``: another
    writer, as on a busy server, always a little ahead of the runner."""

    name = "chaser"

    def __init__(self, services, cap: int) -> None:
        self._services = services
        self.cap = cap
        self.writes = 0

    def apply(self, tx, event, position, backend):
        raise AssertionError("applied in batches")

    def apply_batch(self, tx, items, backend):
        if self.writes < self.cap:
            self.writes += 1
            self._services.workspaces.open(f"chase-{self.writes}")


@pytest.mark.postgres_only
def test_catch_up_ends_at_its_head_while_writes_go_on(services, workspace):
    """catch_up applies what was committed before the call, then returns: it
    does not chase the head while every pass finds something new (the Runtime's
    scan and workspace deletion call it on busy servers). PostgreSQL: a save
    from inside the pass commits on its own connection."""
    from kandev_es.projections.runner import ProjectionRunner

    chaser = _WritesWhileApplied(services, cap=50)
    runner = ProjectionRunner(services.app, services.database, [chaser])
    head = services.app.max_notification_id()
    runner.catch_up()
    assert runner.position("chaser") >= head
    # Each batch saved one more event; chasing them would have gone on to the cap.
    assert chaser.writes < chaser.cap


def _background_writes(writer: str) -> float:
    from kandev_es import metrics

    value = metrics.instruments().registry.get_sample_value(
        "kandev_background_write_transactions_total", {"writer": writer}
    )
    return value or 0.0


def test_inline_positions_are_written_once_per_move_and_counted(
    client, services, member, monkeypatch
):
    """The loop moves the inline projections' positions to the settled head
    in a transaction of its own only when they moved (each one counted as a
    background write, as /metrics shows), never for a pass with nothing new."""
    from kandev_es.projections import runner as loop

    monkeypatch.setattr(loop, "INLINE_TRACKING_SECONDS", 0.0)
    runner = services.projections
    create(client, member[1], external_id="POS-1", title="first")
    head = services.app.max_notification_id()
    writes = _background_writes("projections")

    def positions():
        return {runner.position(name) for name in ("tasks", "feeds")}

    # Settling waits for every transaction open in the cluster (other test
    # workers share it): the positions may take more than one move to get there.
    assert _wait_until(lambda: (runner.run_once(), positions())[1] == {head}, 30)
    assert _background_writes("projections") >= writes + 1
    writes = _background_writes("projections")
    for _ in range(3):
        runner.run_once()
    assert _background_writes("projections") == writes
    assert positions() == {head}
