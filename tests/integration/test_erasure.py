"""Erasure by crypto-shredding (docs/auditing.md: Erasure), on both backends:
a task's free text is stored sealed under its own data key, reads open it, an
event written before the upgrade (cleartext) still reads, and a task whose key
is gone reads as forgotten, never as an error."""

from __future__ import annotations

import json
import uuid

from eventsourcing.persistence import StoredEvent

from kandev_es.domain.task import Task
from tests.conftest import bearer
from tests.integration.helpers import create

MARKER = "Zebra-Marker-4711 jane.doe@example.com"


def stored_events(services, originator_id):
    return list(services.app.recorder.select_events(originator_id))


def delete_key(services, task_id):
    db = services.database
    with db.transaction() as tx:
        tx.execute(
            "DELETE FROM task_keys WHERE task_id = ?",
            (task_id if db.backend == "postgres" else str(task_id),),
        )


def test_free_text_is_stored_sealed_and_reads_back(services, client, member):
    answer = create(
        client, member[1], external_id="ERASE-1", title=MARKER, description=f"call {MARKER}"
    )
    assert answer.status_code == 200, answer.get_json()
    task_id = uuid.UUID(answer.get_json()["id"])
    task = stored_events(services, task_id)
    identity = stored_events(
        services,
        uuid.UUID(answer.get_json()["identity_id"])
        if "identity_id" in answer.get_json()
        else services.app.read(task_id, Task).identity_id,
    )
    for event in task + identity:
        assert b"Zebra-Marker" not in event.state, event.topic
    created = json.loads(task[0].state)
    assert created["sealed"]["v"] == 1 and created["sealed"]["fields"] == ["title", "description"]
    assert "title" not in created
    claimed = next(json.loads(e.state) for e in identity if e.topic.endswith("Claimed"))
    assert claimed["sealed"]["fields"] == ["plan.title", "plan.description"]
    assert "title" not in claimed["plan"] and claimed["plan"]["identifier"]

    got = client.get(f"/api/v1/tasks/{task_id}", headers=bearer(member[1])).get_json()
    assert (got["title"], got["description"]) == (MARKER, f"call {MARKER}")
    loaded = services.app.load(task_id, Task)
    assert loaded is not None and loaded.title == MARKER


def test_an_edit_is_sealed_under_the_task_key(services, client, member):
    answer = create(client, member[1], title="plain")
    task_id = answer.get_json()["id"]
    etag = answer.headers.get("ETag")
    edit = client.patch(
        f"/api/v1/tasks/{task_id}",
        json={"title": MARKER},
        headers={**bearer(member[1]), **({"If-Match": etag} if etag else {})},
    )
    assert edit.status_code == 200, edit.get_json()
    last = stored_events(services, uuid.UUID(task_id))[-1]
    assert last.topic.endswith("Task.Updated") and b"Zebra" not in last.state
    assert json.loads(last.state)["sealed"]["fields"] == ["changes.title"]
    assert services.app.load(uuid.UUID(task_id), Task).title == MARKER


def test_a_cleartext_event_from_before_the_upgrade_still_reads(services):
    """Format 0: an event stored without ``sealed`` decodes as it always did."""
    app = services.app
    task = Task.create(
        uuid.uuid4(),
        workspace_id=uuid.uuid4(),
        identity_id=uuid.uuid4(),
        identifier="KAN-1",
        external_id=None,
        title=MARKER,
        description="d",
        workflow="default",
        workflow_step="backlog",
        parent_id=None,
        repositories=[],
        attachments=[],
        start_agent=False,
        agent_profile=None,
        created_by="test",
    )
    event = task.collect_events()[0]
    stored = app.mapper.to_stored_event(event)  # outside a save: cleartext
    assert MARKER.encode() in stored.state and b'"sealed"' not in stored.state
    decoded = app.mapper.to_domain_event(
        StoredEvent(
            originator_id=stored.originator_id,
            originator_version=1,
            topic=stored.topic,
            state=stored.state,
        )
    )
    assert decoded.title == MARKER


def test_a_lost_key_reads_as_forgotten_not_an_error(services, client, member):
    answer = create(client, member[1], title=MARKER, description="secret")
    task_id = uuid.UUID(answer.get_json()["id"])
    delete_key(services, task_id)
    services.app._snapshots = type(services.app._snapshots)(16)  # a fresh process's cache
    task = services.app.load(task_id, Task)
    assert task is not None and (task.title, task.description) == (None, None)


def test_with_sealing_off_the_free_text_is_cleartext_and_forgotten_by_rewrite(settings, tmp_path):
    """KANDEV_SEAL_FREE_TEXT=false, the bench's baseline: format 0, forgotten
    by rewriting the events under a statement (test_forget_cleartext.py)."""
    import dataclasses

    import pytest

    from kandev_es.api import create_app
    from kandev_es.bootstrap import bootstrap
    from kandev_es.domain.principal import LOCAL_CLI
    from kandev_es.errors import Contended
    from tests.integration.test_ledger import logged

    plain = bootstrap(dataclasses.replace(settings, seal_free_text=False))
    try:
        client = create_app(services=plain, run_projections=False).test_client()
        workspace = plain.workspaces.open("plain")
        secret, _ = plain.tokens.issue(workspace_id=workspace.id, admin=False)
        task_id = uuid.UUID(create(client, secret, title=MARKER).get_json()["id"])
        assert MARKER.encode() in stored_events(plain, task_id)[0].state
        before = stored_events(plain, task_id)
        with pytest.raises(Contended):  # what a forget rewrites must be in the log first
            plain.forgetting().forget(LOCAL_CLI, task_id, "art. 17", "erase-1")
        assert stored_events(plain, task_id) == before  # nothing written
        logged(plain, workspace, None)  # until a checkpoint covers every event
        plain.forgetting().forget(LOCAL_CLI, task_id, "art. 17", "erase-1")
        assert MARKER.encode() not in stored_events(plain, task_id)[0].state
    finally:
        plain.close()


def test_a_read_of_many_streams_fetches_their_keys_in_one_query(services, client, member):
    made = [create(client, member[1], title=f"{MARKER} {n}").get_json()["id"] for n in range(3)]
    ids = [uuid.UUID(task_id) for task_id in made]
    app = services.app
    app._snapshots = type(app._snapshots)(16)  # a process that read none of them
    reader, calls = app.keys.reader, []
    app.keys.reader = lambda wanted: calls.append(list(wanted)) or reader(wanted)
    try:
        read = app.read_many(ids)
    finally:
        app.keys.reader = reader
    assert [read[task_id].title for task_id in ids] == [f"{MARKER} {n}" for n in range(3)]
    assert len(calls) == 1 and sorted(calls[0], key=str) == sorted(ids, key=str)
