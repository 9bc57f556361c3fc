"""Roles: a member token works its workspace's tasks but gets 403
operator_required on release, repository registration, policy, task and
workspace deletion, and changes nothing; an operator token may do them; tokens
stored before roles replay as operators. Runs on SQLite and PostgreSQL."""

from __future__ import annotations

from kandev_es.domain.token import ApiToken, hash_token
from tests.conftest import bearer
from tests.integration.helpers import create


def operator_calls(workspace_id: str, task_id: str) -> list[tuple[str, str, dict | None]]:
    return [
        ("DELETE", f"/api/v1/workspaces/{workspace_id}/tasks/by-external-id?external_id=R-1", None),
        ("POST", f"/api/v1/workspaces/{workspace_id}/repositories", {"name": "r", "path": "/tmp"}),
        ("PUT", f"/api/v1/workspaces/{workspace_id}/policy", {"wip_limit": 3}),
        ("DELETE", f"/api/v1/tasks/{task_id}", None),
        ("DELETE", f"/api/v1/workspaces/{workspace_id}", None),
    ]


def test_a_member_gets_operator_required_and_changes_nothing(client, services, workspace):
    # No role given: least privilege, as on the CLI and REST.
    secret, who = services.tokens.issue(workspace_id=workspace.id, admin=False)
    assert who.role == "member" and not who.is_operator_of(workspace.id)
    task = create(client, secret, title="mine", external_id="R-1")
    assert task.status_code == 200, task.json
    assert client.patch(f"/api/v1/tasks/{task.json['id']}", json={"title": "edited"},
                        headers=bearer(secret)).status_code == 200
    for method, path, body in operator_calls(str(workspace.id), task.json["id"]):
        before = services.app.max_notification_id()
        answer = client.open(path, method=method, json=body,
                             headers={**bearer(secret), "Idempotency-Key": "op-1"})
        assert answer.status_code == 403, (method, path, answer.json)
        assert answer.json["error"] == "operator_required"
        assert services.app.max_notification_id() == before


def test_an_operator_may_set_policy_and_delete(client, services, workspace):
    secret, who = services.tokens.issue(workspace_id=workspace.id, admin=False, role="operator")
    assert who.is_operator_of(workspace.id)
    task = create(client, secret, title="mine").json["id"]
    path = f"/api/v1/workspaces/{workspace.id}/policy"
    assert client.put(path, json={"wip_limit": 3}, headers=bearer(secret)).status_code == 200
    assert client.delete(f"/api/v1/tasks/{task}", headers=bearer(secret)).status_code in (200, 204)
    answer = client.delete(f"/api/v1/workspaces/{workspace.id}", headers=bearer(secret))
    assert answer.status_code == 200, answer.json


def test_a_token_stored_before_roles_replays_as_an_operator(services, workspace):
    legacy = ApiToken.issue(hash_token("kes_legacy-token-secret"), workspace.id, False, "old")
    services.app.save_atomically(legacy)  # an Issued event with no Scoped after it
    who = services.tokens.authenticate("kes_legacy-token-secret")
    assert who is not None and who.role == "operator" and who.is_operator_of(workspace.id)


def test_rest_token_create_defaults_to_member(client, admin, workspace):
    answer = client.post("/api/v1/tokens", json={"workspace_id": str(workspace.id)},
                         headers=bearer(admin[1]))
    assert answer.status_code == 201 and answer.json["role"] == "member"
    bad = client.post("/api/v1/tokens", json={"workspace_id": str(workspace.id), "role": "root"},
                      headers=bearer(admin[1]))
    assert bad.status_code == 422
