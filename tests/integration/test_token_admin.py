"""Token listing and revocation: admin-only REST, the CLI, and a revoked token —
member, operator or admin — refused on its very next request. Runs on SQLite and
PostgreSQL; the last test revokes through the CLI against a real served
process."""

from __future__ import annotations

import json
import uuid

import pytest

from kandev_es.bootstrap import bootstrap
from kandev_es.domain.principal import Unconfirmed
from kandev_es.errors import NOT_VALID_FOR_WORKSPACE
from tests.conftest import bearer
from tests.support.errors import without_request_id
from tests.support.served import ServedProcess, http, run_cli

SECRET_FIELDS = {"token", "token_hash", "secret", "hash"}


def test_admin_lists_tokens_without_secrets(client, services, admin, workspace):
    secret, member = services.tokens.issue(
        workspace_id=workspace.id, admin=False, label="ci", role="member"
    )
    answer = client.get("/api/v1/tokens", headers=bearer(admin[1]))
    assert answer.status_code == 200, answer.json
    listed = {row["id"]: row for row in answer.json["tokens"]}
    row = listed[str(member.token_id)]
    assert (row["role"], row["workspace_id"], row["label"], row["revoked"]) == (
        "member", str(workspace.id), "ci", False
    )
    assert row["created_on"]
    assert listed[str(admin[0].token_id)]["role"] == "admin"
    assert not SECRET_FIELDS & {key for r in listed.values() for key in r}
    assert secret not in answer.get_data(as_text=True)


@pytest.mark.parametrize("role", ["member", "operator", "admin"])
def test_a_revoked_token_is_refused_on_its_next_request(client, services, admin, workspace, role):
    if role == "admin":
        secret, who = services.tokens.issue(workspace_id=None, admin=True)
    else:
        secret, who = services.tokens.issue(workspace_id=workspace.id, admin=False, role=role)
    path = f"/api/v1/workspaces/{workspace.id}"
    assert client.get(path, headers=bearer(secret)).status_code == 200
    gone = client.delete(f"/api/v1/tokens/{who.token_id}", headers=bearer(admin[1]))
    assert gone.status_code == 204
    assert client.get(path, headers=bearer(secret)).status_code == 404
    assert services.tokens.authenticate(secret) is None
    # Revoking twice is harmless and changes nothing.
    before = services.app.max_notification_id()
    again = client.delete(f"/api/v1/tokens/{who.token_id}", headers=bearer(admin[1]))
    assert again.status_code == 204
    assert services.app.max_notification_id() == before
    listed = client.get("/api/v1/tokens", headers=bearer(admin[1])).json["tokens"]
    assert [r["revoked"] for r in listed if r["id"] == str(who.token_id)] == [True]


def test_an_issued_token_answers_with_the_id_its_revocation_takes(client, admin, workspace):
    issued = client.post(
        "/api/v1/tokens", json={"workspace_id": str(workspace.id)}, headers=bearer(admin[1])
    )
    assert issued.status_code == 201, issued.json
    path = f"/api/v1/workspaces/{workspace.id}"
    assert client.get(path, headers=bearer(issued.json["token"])).status_code == 200
    gone = client.delete(f"/api/v1/tokens/{issued.json['id']}", headers=bearer(admin[1]))
    assert gone.status_code == 204
    assert client.get(path, headers=bearer(issued.json["token"])).status_code == 404


def test_token_routes_are_admin_only_and_unknown_is_404(client, services, admin, workspace):
    target, victim = services.tokens.issue(workspace_id=workspace.id, admin=False)
    operator, _ = services.tokens.issue(workspace_id=workspace.id, admin=False, role="operator")
    before = services.app.max_notification_id()
    for secret in (None, target, operator):
        headers = bearer(secret) if secret else {}
        assert client.get("/api/v1/tokens", headers=headers).status_code == 404
        delete = client.delete(f"/api/v1/tokens/{victim.token_id}", headers=headers)
        assert delete.status_code == 404
    assert services.app.max_notification_id() == before
    assert services.tokens.authenticate(target) is not None
    unknown = client.delete(f"/api/v1/tokens/{uuid.uuid4()}", headers=bearer(admin[1]))
    assert unknown.status_code == 404 and unknown.json["error"] == "token_not_found"
    bad = client.delete("/api/v1/tokens/not-a-uuid", headers=bearer(admin[1]))
    assert bad.status_code == 400
    assert services.app.max_notification_id() == before


def test_cli_list_and_revoke(cli, settings):
    assert cli("db", "init").exit_code == 0
    workspace = json.loads(cli("workspace", "create", "ops").stdout.strip().splitlines()[-1])
    issued = json.loads(cli("token", "create", "--workspace", workspace["id"]).stdout)
    secret, token_id = issued["token"], issued["id"]  # printed together: what revoke takes
    listed = [json.loads(line) for line in cli("token", "list").stdout.splitlines()]
    assert len(listed) == 1 and listed[0]["role"] == "member" and not listed[0]["revoked"]
    assert listed[0]["id"] == token_id
    assert secret not in json.dumps(listed)
    first = cli("token", "revoke", token_id)
    assert first.exit_code == 0 and json.loads(first.stdout)["revoked"] is True
    assert cli("token", "revoke", token_id).exit_code == 0
    assert json.loads(cli("token", "list").stdout)["revoked"] is True
    unknown = cli("token", "revoke", str(uuid.uuid4()))
    # one error line, after the line naming the store
    assert unknown.exit_code != 0 and len(unknown.stderr.strip().splitlines()) == 2
    assert unknown.stderr.startswith(f"kandev-es: {settings.backend} store ")
    assert "token not found" in unknown.output
    assert cli("token", "revoke", "nope").exit_code != 0


def test_cli_revoke_against_a_served_process(settings, tmp_path):
    server = ServedProcess(settings, tmp_path)
    try:
        url = f"{server.base}/api/v1/workspaces/{server.workspace_id}"
        assert http("GET", url, server.token).status == 200
        listed = run_cli(settings, "token", "list")
        assert listed.returncode == 0, listed.stderr
        (row,) = [json.loads(line) for line in listed.stdout.splitlines()]
        revoked = run_cli(settings, "token", "revoke", row["id"])
        assert revoked.returncode == 0, revoked.stderr
        assert http("GET", url, server.token).status == 404
    finally:
        server.stop()


def test_a_token_revoked_by_another_process_is_refused_on_its_next_create(
    client, services, settings, workspace
):
    """The create route takes the principal this process cached and confirms the
    token inside the create's own first query: a revocation committed by another
    process is still refused on the very next create -- a Found, a new identity,
    and a bad external_id alike (404 before 400) -- and nothing is written."""
    secret, who = services.tokens.issue(workspace_id=workspace.id, admin=False, role="member")
    held = {"workspace_id": str(workspace.id), "external_id": "REV-1", "title": "t"}
    first = client.post("/api/v1/tasks", json=held, headers=bearer(secret))
    assert first.status_code == 200 and first.json["outcome"] == "created", first.json
    assert isinstance(services.tokens.authenticate_unconfirmed(secret), Unconfirmed)
    again = client.post("/api/v1/tasks", json=held, headers=bearer(secret))
    assert again.json["outcome"] == "found_settled"
    elsewhere = bootstrap(settings.with_overrides(create_tables=False))
    try:
        elsewhere.tokens.revoke(who.token_id)
    finally:
        elsewhere.close()
    before = services.app.max_notification_id()
    for body in (held, {**held, "external_id": "REV-2"}, {**held, "external_id": "REV\n"}):
        answer = client.post("/api/v1/tasks", json=body, headers=bearer(secret))
        assert answer.status_code == 404, answer.json
        assert without_request_id(answer.json) == {
            "error": "task not created", "message": NOT_VALID_FOR_WORKSPACE
        }
    assert services.app.max_notification_id() == before
    assert services.tokens.authenticate_unconfirmed(secret) is None
