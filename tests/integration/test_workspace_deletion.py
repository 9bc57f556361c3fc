"""AC-TASKS-EXTERNAL-ID-001.6, workspace deletion: creations in flight are
fenced, identities are released with reason workspace_deleted and the
deletion generation before the live task rows go; a fenced creation that
wakes up cannot complete into the deleted workspace; identity streams stay."""

from __future__ import annotations

from kandev_es.domain.external_id import identity_id
from kandev_es.domain.identity import Identity
from kandev_es.errors import NOT_VALID_FOR_WORKSPACE
from tests.conftest import bearer
from tests.integration.helpers import (
    PausedCreation,
    branches,
    create,
    make_git_repository,
    worktrees,
)
from tests.support.errors import without_request_id


def delete_workspace(client, workspace, secret):
    return client.delete(f"/api/v1/workspaces/{workspace.id}", headers=bearer(secret))


def test_deletion_needs_an_operator(client, services, workspace):
    secret, _ = services.tokens.issue(workspace_id=workspace.id, admin=False, role="member")
    create(client, secret, external_id="WD-0", title="t")
    answer = delete_workspace(client, workspace, secret)
    assert (answer.status_code, answer.json["error"]) == (403, "operator_required")
    assert services.workspaces.get(workspace.id) is not None


def test_deleting_a_workspace_clears_identities_then_removes_tasks(
    client, services, workspace, member, admin
):
    _, secret = member
    _, admin_secret = admin
    held = create(client, secret, external_id="WD-1", title="t").json
    anonymous = create(client, secret, title="no id").json

    answer = delete_workspace(client, workspace, admin_secret)
    assert answer.status_code == 200
    assert answer.json["deletion_generation"] == 1 and answer.json["tasks_removed"] == 2

    for task in (held, anonymous):
        assert (
            client.get(f"/api/v1/tasks/{task['id']}", headers=bearer(admin_secret)).status_code
            == 404
        )
    identity = services.app.load(identity_id(workspace.id, "WD-1"), Identity)
    assert identity is not None and identity.holder is None
    released = [
        e
        for e in services.app.repository.event_store.get(identity.id)
        if type(e).__name__ == "Released"
    ]
    assert [(e.reason, e.deletion_generation) for e in released] == [("workspace_deleted", 1)]
    refused = create(client, admin_secret, workspace_id=str(workspace.id), title="late")
    assert refused.status_code == 404, refused
    assert without_request_id(refused.json) == {
        "error": "task not created", "message": NOT_VALID_FOR_WORKSPACE
    }
    services.projections.catch_up()
    with services.database.transaction() as tx:
        key = workspace.id if services.database.backend == "postgres" else str(workspace.id)
        assert tx.execute("SELECT count(*) FROM tasks_view WHERE workspace_id = ?", (key,)) == [
            (0,)
        ]


def test_a_fenced_creation_cannot_complete_into_a_deleted_workspace(
    client,
    services,
    workspace,
    member,
    admin,
    paused_owner,
    tmp_path,
):
    _, secret = member
    _, admin_secret = admin
    repo = make_git_repository(tmp_path / "repo")
    services.repositories.register(workspace.id, "repo", str(repo))
    paused = PausedCreation(
        client, workspace, admin_secret, paused_owner, secret,
        {"external_id": "WD-2", "title": "slow", "repositories": ["repo"]},
    )

    assert delete_workspace(client, workspace, admin_secret).status_code == 200
    _, error = paused.finish()
    assert getattr(error, "code", None) == "creation_handed_over"
    assert branches(repo) == ["main"] and worktrees(repo) == []
    identity = services.app.load(identity_id(workspace.id, "WD-2"), Identity)
    assert identity is not None
    tenure = identity.tenure(1)
    assert tenure.phase == "aborted" and tenure.released and tenure.epoch == 1


def test_a_deleted_workspace_name_is_used_again_with_ids_apart_from_its_history(
    client, services, workspace, admin
):
    """The name comes back as a new incarnation whose ids never
    meet the old workspace's events (workspace, identities, tasks)."""
    _, admin_secret = admin
    old = create(client, admin_secret, workspace_id=str(workspace.id), external_id="RE-1",
                 title="old").json
    assert delete_workspace(client, workspace, admin_secret).status_code == 200
    old_history = list(services.app.repository.event_store.get(identity_id(workspace.id, "RE-1")))

    again = client.post("/api/v1/workspaces", json={"name": workspace.name},
                        headers=bearer(admin_secret))
    assert again.status_code in (200, 201), again.json
    new_id = again.json["id"]
    assert new_id != str(workspace.id)
    assert str(services.workspaces.get_by_name(workspace.name).id) == new_id
    # The name is live again: a second open is refused.
    taken = client.post("/api/v1/workspaces", json={"name": workspace.name},
                        headers=bearer(admin_secret))
    assert taken.status_code == 409 and taken.json["error"] == "workspace_exists"

    new = create(client, admin_secret, workspace_id=new_id, external_id="RE-1", title="new").json
    assert new["outcome"] == "created" and new["id"] != old["id"]
    assert client.get(f"/api/v1/tasks/{old['id']}", headers=bearer(admin_secret)).status_code == 404
    # The old identity's stream is untouched by the new workspace's create.
    assert list(
        services.app.repository.event_store.get(identity_id(workspace.id, "RE-1"))
    ) == old_history

    # And once more: a third incarnation after deleting the second.
    gone = client.delete(f"/api/v1/workspaces/{new_id}", headers=bearer(admin_secret))
    assert gone.status_code == 200
    third = client.post("/api/v1/workspaces", json={"name": workspace.name},
                        headers=bearer(admin_secret))
    assert third.status_code in (200, 201) and third.json["id"] not in (new_id, str(workspace.id))


def test_deleting_a_workspace_records_its_generation_on_a_tenure_released_while_preparing(
    client, services, workspace, member, admin, paused_owner
):
    """AC-6: an operator released the tenure while it was preparing;
    the deletion still fences it, records its generation on the identity and
    counts the task it took out."""
    _, secret = member
    _, admin_secret = admin
    paused = PausedCreation(
        client, workspace, admin_secret, paused_owner, secret,
        {"external_id": "WD-3", "title": "slow"},
    )
    released = client.delete(
        f"/api/v1/workspaces/{workspace.id}/tasks/by-external-id",
        query_string={"external_id": "WD-3"},
        headers={**bearer(admin_secret), "Idempotency-Key": "op-wd-3"},
    )
    assert released.status_code == 200 and released.json["creation_complete"] is False

    answer = delete_workspace(client, workspace, admin_secret)
    assert answer.status_code == 200
    assert answer.json["deletion_generation"] == 1 and answer.json["tasks_removed"] == 1
    _, error = paused.finish()
    assert getattr(error, "code", None) == "creation_handed_over"

    identity = services.app.load(identity_id(workspace.id, "WD-3"), Identity)
    assert identity is not None
    tenure = identity.tenure(1)
    assert tenure.phase == "aborted" and tenure.released
    assert tenure.deletion_generation == 1
    kinds = [type(e).__name__ for e in services.app.repository.event_store.get(identity.id)]
    assert kinds.count("Released") == 1 and "WorkspaceDeletionRecorded" in kinds
