"""Tasks saves through its own write (application.py ``Tasks._write``), not
through eventsourcing's ``Application.save``: the same aggregates saved both
ways record the same rows (ids, streams, versions, topics, state bytes) and
answer the same recordings, plain and guarded, on both backends."""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from eventsourcing.application import Application

from kandev_es.application import VersionConflict
from kandev_es.bootstrap import Services, bootstrap
from kandev_es.domain.identity import Identity
from kandev_es.domain.workspace import Workspace
from kandev_es.storage.streams import StreamsAdvanced
from tests.conftest import _drop_schema, postgres_admin_url


@pytest.fixture
def twin(settings: Any, tmp_path: Any) -> Iterator[Services]:
    """A second, empty store on the same backend."""
    if not settings.database_url:
        other = bootstrap(settings.with_overrides(data_dir=tmp_path / "twin"))
        yield other
        other.close()
        return
    schema = f"t_{uuid.uuid4().hex[:16]}"
    separator = "&" if "?" in postgres_admin_url() else "?"
    url = f"{postgres_admin_url()}{separator}schema={schema}"
    other = bootstrap(settings.with_overrides(data_dir=tmp_path / "twin", database_url=url))
    yield other
    other.close()
    _drop_schema(schema)


def _aggregates() -> tuple[Workspace, Identity]:
    workspace = Workspace.open("twins", "TWN")
    workspace.register_repository("main", "/srv/main")
    workspace.set_wip_limit(4)
    identity = Identity.register(uuid.uuid4(), workspace.id, "EXT-1")
    return workspace, identity


def _rows(services: Services) -> list[tuple[Any, ...]]:
    notifications = services.app.recorder.select_notifications(start=1, limit=1000)
    return [
        (n.id, uuid.UUID(str(n.originator_id)), n.originator_version, n.topic, bytes(n.state))
        for n in notifications
    ]


def test_the_library_save_and_tasks_save_record_the_same_rows(
    services: Services, twin: Services
) -> None:
    assert services.app._direct_save and twin.app._direct_save  # the write under test
    before, after = len(_rows(services)), len(_rows(twin))
    library = _aggregates()
    own = copy.deepcopy(library)

    by_library = Application.save(services.app, *library)
    by_tasks = twin.app.save(*own)

    assert [(r.domain_event, r.notification) for r in by_tasks] == [
        (r.domain_event, r.notification) for r in by_library
    ]
    assert len(by_tasks) == 4 and not library[0].pending_events and not own[0].pending_events
    assert _rows(twin)[after:] == _rows(services)[before:]
    # save_atomically answers the last notification id, as before.
    library[0].set_wip_limit(5)
    own = (copy.deepcopy(library[0]), own[1])
    last = Application.save(services.app, library[0])[-1].notification.id
    assert twin.app.save_atomically(own[0]) == last
    assert _rows(twin)[after:] == _rows(services)[before:]


def test_a_guarded_save_refuses_the_same_way_through_both(
    services: Services, twin: Services
) -> None:
    before, after = len(_rows(services)), len(_rows(twin))
    library = _aggregates()
    own = copy.deepcopy(library)
    Application.save(services.app, *library)
    twin.app.save(*own)
    read = {library[0].id: library[0].version - 1}  # the workspace has moved on since
    library[1].trigger_event(Identity.Event)
    own = (own[0], copy.deepcopy(library[1]))
    with pytest.raises(StreamsAdvanced):
        Application.save(services.app, library[1], unchanged=read)
    with pytest.raises(VersionConflict):
        twin.app.save_atomically(own[1], unchanged=read)
    assert _rows(twin)[after:] == _rows(services)[before:]
    assert len(_rows(twin)) == after + 4  # the refused save wrote nothing


def test_a_stale_save_is_a_version_conflict_and_writes_nothing(services: Services) -> None:
    """Two writers from the same read: the second's insert hits the stream's
    unique version (PostgreSQL: psycopg's IntegrityError, mapped to the
    library's by recorders.py) and becomes VersionConflict; on PostgreSQL the
    connection goes back to the pool either way."""
    app = services.app
    workspace = Workspace.open("stale", "STL")
    app.save_atomically(workspace)
    first, second = app.load(workspace.id, Workspace), app.load(workspace.id, Workspace)
    assert first is not None and second is not None
    first.set_wip_limit(1)
    second.set_wip_limit(2)
    app.save_atomically(first)
    notifier = getattr(app.recorder, "notifier", None)
    if notifier is not None:
        # Its NOTIFYs check a pooled connection out after saves: send what is
        # due and stop, so only the stale save can move the pool's count.
        notifier.stop()
    rows = _rows(services)
    pool = getattr(app.recorder.datastore, "pool", None)
    idle = pool.get_stats()["pool_available"] if hasattr(pool, "get_stats") else None
    with pytest.raises(VersionConflict):
        app.save_atomically(second)
    assert _rows(services) == rows
    if idle is not None:
        assert pool.get_stats()["pool_available"] == idle
    loaded = app.load(workspace.id, Workspace)
    assert loaded is not None and loaded.wip_limit == 1


@pytest.mark.postgres_only
def test_a_save_is_one_transaction_and_its_notify_follows_its_commit(services: Services) -> None:
    """A save is one statement on an autocommit session (one commit); the
    NOTIFY that wakes projection runners goes out after it from the
    process's notifier (storage/notifier.py): when it arrives, the events are
    already visible to another session, and a burst of saves shares NOTIFYs."""
    import psycopg

    recorder: Any = services.app.recorder
    # Off while every read model is written inline; an asynchronous view turns it on.
    assert not recorder.notifier.enabled
    recorder.notifier.enabled = True
    table = f'"{recorder.datastore.schema}"."{recorder.events_table_name}"'
    with psycopg.connect(postgres_admin_url(), autocommit=True) as listener:
        listener.execute(f'LISTEN "{recorder.channel_name}"')
        sent = recorder.notifier.sent
        last = services.app.save_atomically(Workspace.open("notified", "NTF"))
        heard = next(iter(listener.notifies(timeout=10, stop_after=1)), None)
        assert heard is not None
        seen = listener.execute(f"SELECT max(notification_id) FROM {table}").fetchone()
        assert seen is not None and seen[0] >= last
        # The notifier counts a NOTIFY once its statement returned, just after
        # the listener may have heard it.
        deadline = time.monotonic() + 10
        while recorder.notifier.sent == sent and time.monotonic() < deadline:
            time.sleep(0.01)
        assert recorder.notifier.sent > sent
        # 50 saves back to back: every one is followed by a NOTIFY, far fewer sent.
        sent = recorder.notifier.sent
        for n in range(50):
            services.app.save_atomically(Workspace.open(f"burst-{n}", "BRS"))
        deadline = time.monotonic() + 10
        while recorder.notifier.sent == sent and time.monotonic() < deadline:
            time.sleep(0.01)
        assert 0 < recorder.notifier.sent - sent < 50
