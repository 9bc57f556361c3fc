"""A create whose plan has no effects is claimed and completed in ONE
transaction, guarded by the workspace version read at admission (the lookup's
read, for such a plan): a workspace deletion that lands between admission and
that transaction makes it write nothing (it cannot leave a task the deletion's
scan missed). The read path behind a Found fetches several streams in one
query and never changes a snapshot another reader holds."""

from __future__ import annotations

import uuid

import pytest

from kandev_es.application import VersionConflict
from kandev_es.domain.external_id import identity_id
from kandev_es.domain.identity import Identity
from kandev_es.domain.workspace import Workspace
from kandev_es.errors import TaskNotCreated


def test_a_guarded_save_writes_nothing_once_the_guarded_stream_moved_on(services, workspace):
    app = services.app
    read_version = workspace.version
    current = app.load(workspace.id, Workspace)
    current.set_wip_limit(3)
    app.save_atomically(current)
    before = app.max_notification_id()

    late = Identity.register(uuid.uuid4(), workspace.id, "G-1")
    with pytest.raises(VersionConflict):
        app.save_atomically(late, unchanged={workspace.id: read_version})
    assert app.max_notification_id() == before
    assert app.load(late.id, Identity) is None

    fresh = Identity.register(uuid.uuid4(), workspace.id, "G-2")
    app.save_atomically(fresh, unchanged={workspace.id: current.version})
    assert app.load(fresh.id, Identity) is not None


def test_an_effect_free_create_commits_claim_and_completion_together(services, member):
    principal, _ = member
    before = services.app.max_notification_id()
    result = services.creation.create(principal, {"external_id": "ONE-TX", "title": "t"})
    assert result.outcome.value == "created"
    identity = services.app.load(identity_id(principal.workspace_id, "ONE-TX"), Identity)
    assert identity is not None and identity.holder is not None and identity.holder.settled
    # Registered, Claimed, Completed + Task CreatedActive: four events, one save.
    assert services.app.max_notification_id() - before >= 4
    kinds = [
        n.topic.rsplit(".", 1)[1]
        for n in services.app.recorder.select_notifications(start=before + 1, limit=100)
    ]
    assert kinds == ["Registered", "Claimed", "Completed", "CreatedActive"]


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_a_deletion_between_lookup_and_claim_leaves_no_task(services, member, monkeypatch, warm):
    # The lookup's workspace read is an effect-free plan's admission. The
    # office number is drawn right after it (cold) or, where the store can,
    # in the same query (warm snapshots: test_office_number_draw.py), so a
    # deletion landing after the draw is exactly the one the claim
    # transaction's guard must see.
    principal, _ = member
    service = services.creation
    app = services.app
    if warm:
        service.create(principal, {"external_id": "WARM-1", "title": "t"})
    deleted: list[uuid.UUID] = []

    def delete_once(workspace_id: uuid.UUID) -> None:
        if not deleted:
            deleted.append(workspace_id)
            services.workspace_deletion.delete(workspace_id, actor="cli")

    draw, read_and_draw = app.next_office_number, app.read_and_draw

    def draw_then_workspace_deleted(workspace_id):
        number = draw(workspace_id)
        delete_once(workspace_id)
        return number

    def read_draw_then_workspace_deleted(ids, workspace_id, versions):
        reads, number = read_and_draw(ids, workspace_id, versions)
        if number is not None:
            delete_once(workspace_id)
        return reads, number

    monkeypatch.setattr(app, "next_office_number", draw_then_workspace_deleted)
    monkeypatch.setattr(app, "read_and_draw", read_draw_then_workspace_deleted)
    before = app.max_notification_id()
    with pytest.raises(TaskNotCreated):
        service.create(principal, {"external_id": "RACE-1", "title": "t"})
    assert deleted == [principal.workspace_id]
    assert app.max_notification_id() > before  # the deletion's own events, nothing of the create
    assert app.load(identity_id(principal.workspace_id, "RACE-1"), Identity) is None
    services.projections.catch_up()
    items = services.tasks.list(principal.workspace_id).items
    assert [item for item in items if item["external_id"] == "RACE-1"] == []


def test_read_many_catches_up_several_streams_without_touching_held_snapshots(
    services, workspace
):
    app = services.app
    missing = uuid.uuid4()
    first = app.read_many([workspace.id, missing])
    assert first[missing] is None
    held = first[workspace.id]
    assert isinstance(held, Workspace) and held.wip_limit is None

    current = app.load(workspace.id, Workspace)
    current.set_wip_limit(5)
    app.save_atomically(current)

    again = app.read_many([workspace.id])[workspace.id]
    assert isinstance(again, Workspace) and again.wip_limit == 5
    assert held.wip_limit is None and held.version == workspace.version
