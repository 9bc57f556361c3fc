"""Authorization precedes validation: an unknown workspace or a token of
another workspace gets 404 {"error": "task not created"} and learns nothing.
Its message says what the caller can know of its own credential (none sent,
not a bearer token, malformed: with WWW-Authenticate: Bearer when no token was
sent) and otherwise one text whether or not the workspace exists (issue 46)."""

from __future__ import annotations

import json
import uuid

import pytest

from kandev_es.errors import NOT_VALID_FOR_WORKSPACE
from kandev_es.services.auth import MALFORMED_TOKEN, NO_BEARER_TOKEN, NOT_A_BEARER_TOKEN
from tests.conftest import bearer
from tests.integration.helpers import create
from tests.support.errors import without_request_id

NOT_CREATED = {"error": "task not created", "message": NOT_VALID_FOR_WORKSPACE}
CHALLENGE = 'Bearer realm="kandev-es"'


@pytest.fixture
def other_workspace_secret(services):
    other = services.workspaces.open("other", "OTH")
    secret, _ = services.tokens.issue(workspace_id=other.id, admin=False)
    return secret


def test_create_without_token_is_404_task_not_created(client, services, workspace):
    before = services.app.max_notification_id()
    answer = client.post("/api/v1/tasks", json={"workspace_id": str(workspace.id), "title": "t"})
    assert answer.status_code == 404
    assert without_request_id(answer.json) == {
        "error": "task not created",
        "message": NO_BEARER_TOKEN,
    }
    assert answer.headers["WWW-Authenticate"] == CHALLENGE
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


@pytest.mark.parametrize(
    ("header", "message", "challenged"),
    [
        (None, NO_BEARER_TOKEN, True),
        ("", NO_BEARER_TOKEN, True),
        ("Bearer ", NO_BEARER_TOKEN, True),
        ("Basic YWRtaW46YWRtaW4=", NOT_A_BEARER_TOKEN, True),
        ("kes_x", NOT_A_BEARER_TOKEN, True),
        ("Bearer not-ours", MALFORMED_TOKEN, False),
        ("Bearer kes_" + "x" * 300, MALFORMED_TOKEN, False),
        ("Bearer kes_wrong", NOT_VALID_FOR_WORKSPACE, False),
    ],
)
def test_each_refused_credential_says_what_it_was(
    header, message, challenged, client, services, workspace
):
    before = services.app.max_notification_id()
    answer = client.post(
        "/api/v1/tasks",
        json={"workspace_id": str(workspace.id), "title": "t"},
        headers={} if header is None else {"Authorization": header},
    )
    assert answer.status_code == 404
    assert without_request_id(answer.json) == {"error": "task not created", "message": message}
    assert answer.headers.get("WWW-Authenticate") == (CHALLENGE if challenged else None)
    assert services.app.max_notification_id() == before


def test_a_token_naming_an_existing_or_a_missing_workspace_gets_the_same_body(
    client, services, workspace, admin, other_workspace_secret
):
    """Another workspace's id, one that never existed and a deleted one: the
    same status, body (less the request id) and headers, so nothing tells them
    apart; a wrong token in the caller's own workspace reads the same."""
    _, admin_secret = admin
    gone = services.workspaces.open("gone", "GON")
    services.workspace_deletion.delete(gone.id, actor="test")
    answers = {
        "other workspace's id": create(
            client, other_workspace_secret, workspace_id=str(workspace.id), title="t"
        ),
        "nonexistent workspace": create(
            client, other_workspace_secret, workspace_id=str(uuid.uuid4()), title="t"
        ),
        "deleted workspace": create(client, admin_secret, workspace_id=str(gone.id), title="t"),
        "admin, nonexistent workspace": create(
            client, admin_secret, workspace_id=str(uuid.uuid4()), title="t"
        ),
        "wrong token": create(client, "kes_" + "w" * 43, workspace_id=str(workspace.id)),
    }
    for name, answer in answers.items():
        assert answer.status_code == 404, name
        assert without_request_id(answer.json) == NOT_CREATED, name
        assert "WWW-Authenticate" not in answer.headers, name
    bodies = {json.dumps(without_request_id(a.json)) for a in answers.values()}
    assert len(bodies) == 1, bodies


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
    raw = [n.state for n in services.app.recorder.select_notifications(start=1, limit=10_000)]
    assert not any(secret.encode() in blob for blob in raw)
    assert services.tokens.authenticate(secret) == principal
