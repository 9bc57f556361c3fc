"""Blue/green projection rebuilds: same feed ids and order, same task list,
attested schema afterwards, live runners unaffected."""

from __future__ import annotations

import threading
import time

import pytest
from kandev_es.projections.rebuild import rebuild, rebuildable

from kandev_es.errors import UnknownProjection
from tests.conftest import bearer
from tests.integration.helpers import TASK_CREATED_SOURCES, create
from tests.integration.test_feeds import release


def _history(client, secret):
    tasks = []
    for i in range(6):
        tasks.append(create(client, secret, external_id=f"H-{i}", title=f"t{i}").json)
    tasks.append(create(client, secret, title="anonymous").json)
    create(client, secret, external_id="H-1", title="found retry")
    client.patch(f"/api/v1/tasks/{tasks[0]['id']}", json={"title": "e"}, headers=bearer(secret))
    client.post(f"/api/v1/tasks/{tasks[1]['id']}/archive", headers=bearer(secret))
    client.delete(f"/api/v1/tasks/{tasks[2]['id']}", headers=bearer(secret))
    return tasks


def _snapshot(client, services, workspace, secret):
    services.projections.catch_up()
    with services.database.transaction() as tx:
        feed = tx.execute(
            "SELECT position, event_id, type, subject, timestamp, data FROM feed_events"
            " ORDER BY position"
        )
        identities = tx.execute("SELECT * FROM identities_view ORDER BY identity_id")
    listed = client.get(f"/api/v1/workspaces/{workspace.id}/tasks", headers=bearer(secret)).json
    return [tuple(map(str, row)) for row in feed], identities, listed


def test_rebuild_reproduces_feed_ids_order_and_task_list(client, services, workspace, member):
    _, secret = member
    tasks = _history(client, secret)
    release(services, tasks[3]["id"])
    before = _snapshot(client, services, workspace, secret)
    assert len(before[0]) == 6 + 1 + 3  # creations, anonymous, patch + archive + release
    for _ in range(2):  # twice: the swapped-in tables and indexes rebuild again
        for name in ("tasks", "identities", "feeds"):
            result = rebuild(services.projections, name, batch_size=7)
            assert result.position == services.app.max_notification_id()
        assert _snapshot(client, services, workspace, secret) == before
    assert services.attestation.refresh().ok, services.attestation.current.problems
    assert set(services.projections.lag().values()) == {0}

    after = create(client, secret, external_id="H-new", title="after").json
    feed, _, listed = _snapshot(client, services, workspace, secret)
    assert feed[:-1] == before[0] and feed[-1][3] == after["id"]
    assert listed["items"][-1]["id"] == after["id"]


def test_rebuild_under_live_traffic_loses_and_duplicates_nothing(
    client, services, workspace, member
):
    _, secret = member
    for i in range(10):
        create(client, secret, external_id=f"V-{i}", title=f"v{i}")
    thread = services.projections.start_thread(poll_seconds=0.02)
    writer = threading.Thread(
        target=lambda: [create(client, secret, external_id=f"W-{i}", title="w") for i in range(20)]
    )
    try:
        writer.start()
        rebuild(services.projections, "feeds", batch_size=3)
        rebuild(services.projections, "tasks", batch_size=3)
        writer.join(60)
    finally:
        services.projections.stop()
        thread.join(5)
    services.projections.catch_up()
    activated = [
        n.id
        for n in services.app.recorder.select_notifications(start=1, limit=1_000_000)
        if n.topic.endswith(TASK_CREATED_SOURCES)
    ]
    with services.database.transaction() as tx:
        positions = [row[0] for row in tx.execute("SELECT position FROM feed_events ORDER BY 1")]
        (count,) = tx.execute("SELECT COUNT(*) FROM tasks_view")[0]
    assert positions == activated and len(activated) == 30
    assert count == 30


def test_rebuild_refuses_unknown_projections_and_every_known_one_is_rebuildable(services):
    with pytest.raises(UnknownProjection):
        rebuild(services.projections, "nope")
    for projection in services.projections.projections:
        assert rebuildable(services.projections, projection.name).tables


def test_cli_rebuild_prints_events_per_second(cli, client, services, workspace, member):
    _, secret = member
    _history(client, secret)
    before = _snapshot(client, services, workspace, secret)
    result = cli("projections", "rebuild", "--name", "feeds", "--name", "tasks")
    assert result.exit_code == 0, result.output
    assert "rebuilt feeds:" in result.stdout and "events/s" in result.stdout
    assert "rebuilt tasks:" in result.stdout
    assert _snapshot(client, services, workspace, secret) == before
    everything = cli("projections", "rebuild")
    assert everything.exit_code == 0 and "rebuilt identities:" in everything.stdout
    unknown = cli("projections", "rebuild", "--name", "feeds", "--name", "nope")
    assert unknown.exit_code != 0 and "no projection 'nope'" in unknown.output


def test_creations_read_model_rebuilds_to_the_same_in_flight_rows(services, workspace):
    from tests.integration.helpers import start_unsettled_creation

    start_unsettled_creation(services, workspace, "IN-FLIGHT-1")
    services.projections.catch_up()
    query = "SELECT identity_id, tenure, phase, epoch FROM creations_view ORDER BY identity_id"
    with services.database.transaction() as tx:
        before = tx.execute(query)
    assert len(before) == 1
    rebuild(services.projections, "creations")
    with services.database.transaction() as tx:
        assert tx.execute(query) == before


READ_MODELS = {
    "tasks_view": "task_id", "identities_view": "identity_id",
    "creations_view": "identity_id, tenure", "feed_events": "position", "feed_tasks": "task_id",
}  # fmt: skip


def _read_models(services):
    with services.database.transaction() as tx:
        found = {t: tx.execute(f"SELECT * FROM {t} ORDER BY {k}") for t, k in READ_MODELS.items()}
    return {table: [tuple(map(str, row)) for row in rows] for table, rows in found.items()}


def test_a_rebuild_under_a_running_create_load_ends_equal_to_a_replay_from_scratch(
    cli, client, services, workspace, member
):
    """Every read model rebuilt while creates (and edits) keep coming: at each
    switch the new tables take the events saved since their replay and the
    saves go on into them -- none missed, none applied twice."""
    _, secret = member
    done = threading.Event()
    made: list[str] = []

    def load() -> None:
        i = 0
        while not done.is_set():
            answer = create(client, secret, external_id=f"LOAD-{i}", title=f"l{i}")
            assert answer.status_code == 200, answer.json
            made.append(answer.json["id"])
            if i % 5 == 4:
                client.patch(f"/api/v1/tasks/{made[-2]}", json={"title": "edited"},
                             headers=bearer(secret))
            i += 1

    writer = threading.Thread(target=load)
    writer.start()
    try:
        while len(made) < 5:
            time.sleep(0.01)
        for name in ("tasks", "identities", "creations", "feeds"):
            started = len(made)
            result = rebuild(services.projections, name, batch_size=4)
            assert result.paused_seconds >= 0
            while len(made) < started + 3:  # creates went on across the switch
                time.sleep(0.01)
    finally:
        done.set()
        writer.join(60)
    under_load = _read_models(services)
    assert len(under_load["tasks_view"]) == len(made)
    assert len(under_load["feed_events"]) >= len(made)

    for name in ("tasks", "identities", "creations", "feeds"):  # from scratch, at rest
        rebuild(services.projections, name)
    assert _read_models(services) == under_load
    verified = cli("audit", "verify")
    assert verified.exit_code == 0, verified.output
