"""Authorization precedes validation: an unknown workspace or a token of
another workspace gets 404 {"error": "task not created"} and learns nothing."""

from __future__ import annotations

import pytest

from tests.conftest import bearer
from tests.integration.helpers import create
from tests.support.errors import without_request_id

NOT_CREATED = {"error": "task not created"}


@pytest.fixture
def other_workspace_secret(services):
    other = services.workspaces.open("other", "OTH")
    secret, _ = services.tokens.issue(workspace_id=other.id, admin=False)
    return secret


def test_create_without_token_is_404_task_not_created(client, services, workspace):
    before = services.app.max_notification_id()
    answer = client.post(
        "/api/v1/tasks", json={"workspace_id": str(workspace.id), "title": "t"}
    )
    assert answer.status_code == 404 and without_request_id(answer.json) == NOT_CREATED
    assert services.app.max_notification_id() == before


@pytest.mark.parametrize(
    "body",
    [
        {"title": "valid"},
        {"title": ""},
        {"external_id": "bad\x01id", "title": "t"},
        {"external_id": "x" * 300},
        {"workflow": "nope"},
    ],
)
def test_token_of_another_workspace_is_denied_before_any_validation(
    body, client, services, workspace, other_workspace_secret
):
    before = services.app.max_notification_id()
    answer = create(client, other_workspace_secret, workspace_id=str(workspace.id), **body)
    assert answer.status_code == 404
    assert without_request_id(answer.json) == NOT_CREATED
    assert services.app.max_notification_id() == before


def test_a_held_identity_is_not_revealed_to_another_workspace(
    client, workspace, member, other_workspace_secret
):
    _, secret = member
    create(client, secret, external_id="SECRET-1", title="hidden")
    probe = create(
        client,
        other_workspace_secret,
        workspace_id=str(workspace.id),
        external_id="SECRET-1",
        title="x",
    )
    assert probe.status_code == 404 and without_request_id(probe.json) == NOT_CREATED


def test_unknown_or_malformed_workspace_is_404_task_not_created(client, admin):
    _, secret = admin
    for workspace_id in ["00000000-0000-0000-0000-000000000000", "not-a-uuid", 7]:
        answer = create(client, secret, workspace_id=workspace_id, title="t")
        assert answer.status_code == 404 and without_request_id(answer.json) == NOT_CREATED


def test_invalid_token_is_denied(client, workspace):
    for header in ["Bearer kes_wrong", "Bearer ", "Basic abc", "kes_x"]:
        answer = client.post(
            "/api/v1/tasks",
            json={"workspace_id": str(workspace.id), "title": "t"},
            headers={"Authorization": header},
        )
        assert answer.status_code == 404 and without_request_id(answer.json) == NOT_CREATED


def test_admin_token_acts_on_every_workspace(client, services, admin):
    _, secret = admin
    for name in ["alpha", "beta"]:
        target = services.workspaces.open(name)
        answer = create(client, secret, workspace_id=str(target.id), title=name)
        assert answer.status_code == 200 and answer.json["workspace_id"] == str(target.id)


def test_admin_token_must_name_a_workspace(client, admin):
    _, secret = admin
    answer = create(client, secret, title="where?")
    assert answer.status_code == 404 and without_request_id(answer.json) == NOT_CREATED


def test_reads_of_another_workspace_are_404(client, workspace, member, other_workspace_secret):
    _, secret = member
    task = create(client, secret, external_id="R-1", title="mine").json
    other = bearer(other_workspace_secret)
    assert client.get(f"/api/v1/tasks/{task['id']}", headers=other).status_code == 404
    lookup = client.get(
        f"/api/v1/workspaces/{workspace.id}/tasks/by-external-id",
        query_string={"external_id": "R-1"},
        headers=other,
    )
    assert lookup.status_code == 404, lookup
    assert without_request_id(lookup.json) == {"error": "task not found"}
    listing = client.get(f"/api/v1/workspaces/{workspace.id}/tasks", headers=other)
    assert listing.status_code == 404
    patch = client.patch(f"/api/v1/tasks/{task['id']}", json={"title": "x"}, headers=other)
    assert patch.status_code == 404
    assert client.delete(f"/api/v1/tasks/{task['id']}", headers=other).status_code == 404
    assert client.get(f"/api/v1/tasks/{task['id']}", headers=bearer(secret)).json["title"] == (
        "mine"
    )


def test_tokens_are_stored_only_as_hashes(services, workspace):
    secret, principal = services.tokens.issue(workspace_id=workspace.id, admin=False)
    raw = [
        n.state for n in services.app.recorder.select_notifications(start=1, limit=10_000)
    ]
    assert not any(secret.encode() in blob for blob in raw)
    assert services.tokens.authenticate(secret) == principal
