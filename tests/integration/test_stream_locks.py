"""Without the table lock, a guarded save is still exact on PostgreSQL: a write
to the guarded stream that is in flight when the guarded save starts makes the
guarded save wait (the stream's shared lock), see the write once it commits,
and write nothing (docs/architecture.md: Ordering without a global lock)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import psycopg
import pytest

from kandev_es.application import VersionConflict
from kandev_es.bootstrap import bootstrap
from kandev_es.domain.identity import Identity
from kandev_es.domain.workspace import Workspace

INSERT = (
    "SELECT kandev_insert_events(%b::uuid[], %b::bigint[], %b::text[], %b::bytea[],"
    " %b::uuid[], %b::bigint[])"
)
WAITING_ADVISORY = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"


@pytest.mark.postgres_only
def test_a_guarded_save_waits_for_a_write_in_flight_to_its_guard_and_then_writes_nothing(
    services, workspace, settings
) -> None:
    _guarded_save_waits_then_writes_nothing(services.app, workspace, settings)


@pytest.mark.postgres_only
def test_the_guard_holds_when_the_servers_default_isolation_is_repeatable_read(
    services, workspace, settings, monkeypatch
) -> None:
    """The store's sessions run their saves under READ COMMITTED whatever the
    server's default (here REPEATABLE READ for every new session, set through
    libpq): the guarded save still waits, sees the write and writes nothing."""
    monkeypatch.setenv("PGOPTIONS", "-c default_transaction_isolation=repeatable\\ read")
    with psycopg.connect(settings.postgres.conninfo) as probe:
        row = probe.execute("SHOW default_transaction_isolation").fetchone()
    assert row == ("repeatable read",)
    fresh = bootstrap(settings.with_overrides(create_tables=False))
    try:
        _guarded_save_waits_then_writes_nothing(fresh.app, workspace, settings)
    finally:
        fresh.close()


def _guarded_save_waits_then_writes_nothing(app: Any, workspace: Any, settings: Any) -> None:
    read_version = workspace.version
    moving = app.load(workspace.id, Workspace)
    moving.set_wip_limit(3)
    stored = [app.mapper.to_stored_event(e) for e in moving.collect_events()]
    writer = psycopg.connect(settings.postgres.schema_conninfo)  # a transaction, held
    watcher = psycopg.connect(settings.postgres.conninfo, autocommit=True)
    outcome: dict[str, Any] = {}
    late = Identity.register(uuid.uuid4(), workspace.id, "G-1")

    def guarded_save() -> None:
        try:
            app.save_atomically(late, unchanged={workspace.id: read_version})
            outcome["saved"] = True
        except VersionConflict:
            outcome["saved"] = False

    try:
        writer.execute(
            INSERT,
            (
                [e.originator_id for e in stored],
                [e.originator_version for e in stored],
                [e.topic for e in stored],
                [e.state for e in stored],
                [],
                [],
            ),
        )
        saver = threading.Thread(target=guarded_save)
        saver.start()
        deadline = time.monotonic() + 30
        # The guarded save must queue behind the write in flight (a save that
        # checked without waiting would finish here, having seen nothing).
        while saver.is_alive():
            row = watcher.execute(WAITING_ADVISORY).fetchone()
            if row is not None and row[0] > 0:
                break
            assert time.monotonic() < deadline, "the guarded save never waited"
            time.sleep(0.01)
        writer.commit()
        saver.join(30)
        assert outcome == {"saved": False}
        assert app.load(late.id, Identity) is None
        assert app.load(workspace.id, Workspace).version == read_version + 1
    finally:
        writer.close()
        watcher.close()


@pytest.mark.postgres_only
def test_a_guarded_save_in_a_repeatable_read_transaction_is_refused(
    services, workspace, settings
) -> None:
    """Under REPEATABLE READ the guard would read with the transaction's first
    snapshot, older than the locks: a write to the guard stream committed in
    between would pass unseen. The save refuses such a transaction and writes
    nothing (the service's own saves are single READ COMMITTED statements)."""
    app = services.app
    read_version = workspace.version
    late = Identity.register(uuid.uuid4(), workspace.id, "G-2")
    stored = [app.mapper.to_stored_event(e) for e in late.collect_events()]
    with psycopg.connect(settings.postgres.schema_conninfo) as saver:
        saver.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        saver.execute("SELECT 1")  # the transaction's snapshot
        moving = app.load(workspace.id, Workspace)
        moving.set_wip_limit(4)
        app.save(moving)  # the guard stream moves on after that snapshot
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            saver.execute(
                INSERT,
                (
                    [e.originator_id for e in stored],
                    [e.originator_version for e in stored],
                    [e.topic for e in stored],
                    [e.state for e in stored],
                    [workspace.id],
                    [read_version],
                ),
            )
        saver.rollback()
    assert app.load(late.id, Identity) is None
    assert app.load(workspace.id, Workspace).version == read_version + 1
