"""Run credentials are run credentials: off the run routes a run token is no
principal (the same 404 as no token at all), except for reading its own task
with its run id; and it stops working when the run ends — the agent exits, the
launch fails, the task is archived or deleted, the workspace is deleted — or its
expiry passes. Runs on SQLite and PostgreSQL."""

from __future__ import annotations

import time
import uuid

from kandev_es.agent.processes import stop_run
from kandev_es.domain.token import ApiToken, run_token_id_for
from kandev_es.services.auth import TokenService
from tests.conftest import bearer
from tests.integration.helpers import create
from tests.integration.runs import AGENTCTL, ROOT
from tests.support.errors import without_request_id

WAIT_S = 30.0
UNKNOWN_TOKEN = "kes_" + "0" * 43


def off_run_routes(run, workspace_id) -> list[tuple[str, str, dict | None]]:
    return [
        ("POST", "/api/v1/tasks", {"workspace_id": workspace_id, "title": "probe"}),
        ("GET", f"/api/v1/workspaces/{workspace_id}/tasks", None),
        ("PATCH", f"/api/v1/tasks/{run.task_id}", {"title": "hijacked"}),
        ("POST", f"/api/v1/tasks/{run.task_id}/archive", None),
        ("DELETE", f"/api/v1/tasks/{run.task_id}", None),
        ("GET", f"/api/v1/workspaces/{workspace_id}/events", None),
        ("GET", f"/api/v1/workspaces/{workspace_id}/events/stream", None),
        ("GET", f"/api/v1/workspaces/{workspace_id}/identities/history", None),
    ]


def test_a_run_token_is_no_principal_off_the_run_routes(client, services, workspace, run):
    for method, path, body in off_run_routes(run, str(workspace.id)):
        # As a token that authenticates nobody (no token at all is told apart:
        # a refused create says none was sent).
        anonymous = client.open(path, method=method, json=body, headers=bearer(UNKNOWN_TOKEN))
        before = services.app.max_notification_id()
        for headers in (bearer(run.token), run.headers()):
            answer = client.open(path, method=method, json=body, headers=headers)
            assert answer.status_code == anonymous.status_code, (method, path)
            assert without_request_id(answer.json) == without_request_id(anonymous.json), (
                method, path,
            )
            assert answer.status_code in (401, 404), (method, path, answer.status_code)
        assert services.app.max_notification_id() == before


def test_a_run_reads_its_own_task_only_with_its_run_id(client, member, run):
    own = f"/api/v1/tasks/{run.task_id}"
    assert client.get(own, headers=run.headers()).status_code == 200
    assert client.get(own, headers=bearer(run.token)).status_code == 404
    other = create(client, member[1], title="someone else's").json["id"]
    assert client.get(f"/api/v1/tasks/{other}", headers=run.headers()).status_code == 404
    assert client.get(f"/api/v1/tasks/{other}", headers=bearer(member[1])).status_code == 200


def works(client, run) -> bool:
    answer = client.post(
        AGENTCTL, json={"title": "from run", "external_id": uuid.uuid4().hex},
        headers=run.headers(),
    )
    return bool(answer.status_code == 200)


def revoked(services, run_id: str) -> bool:
    token = services.app.load(run_token_id_for(run_id), ApiToken)
    return token is not None and token.revoked


def assert_saved_with_the_task(services, run) -> None:
    """The credential's Revoked and the task's last event (Archived, Deleted)
    are one save: no crash can leave an ended task's credential alive. Only
    PostgreSQL records each event's transaction (transaction_id)."""
    if services.database.backend != "postgres":
        return
    table = services.app.recorder.events_table_name
    with services.database.transaction() as tx:
        rows = tx.execute(
            f"SELECT DISTINCT transaction_id::text FROM {table} e"
            " WHERE e.originator_id IN (?, ?) AND e.originator_version ="
            f" (SELECT max(originator_version) FROM {table} WHERE originator_id = e.originator_id)",
            (uuid.UUID(run.task_id), run_token_id_for(run.run_id)),
        )
    assert len(rows) == 1, rows


def test_archiving_the_task_revokes_its_run_credential(client, services, member, run):
    assert works(client, run)
    answer = client.post(f"/api/v1/tasks/{run.task_id}/archive", headers=bearer(member[1]))
    assert answer.status_code == 200, answer.json
    assert revoked(services, run.run_id) and not works(client, run)
    assert_saved_with_the_task(services, run)
    assert client.post(f"{ROOT}/{run.task_id}/subtasks", json={"title": "x"},
                       headers=run.headers()).status_code == 404


def test_deleting_the_task_revokes_its_run_credential(client, services, operator, run):
    assert works(client, run)
    answer = client.delete(f"/api/v1/tasks/{run.task_id}", headers=bearer(operator[1]))
    assert answer.status_code in (200, 204), answer.json
    assert revoked(services, run.run_id) and not works(client, run)
    assert_saved_with_the_task(services, run)


def test_deleting_the_workspace_revokes_its_run_credentials(client, services, workspace,
                                                             admin, run):
    assert works(client, run)
    answer = client.delete(f"/api/v1/workspaces/{workspace.id}", headers=bearer(admin[1]))
    assert answer.status_code == 200, answer.json
    assert revoked(services, run.run_id) and not works(client, run)
    assert_saved_with_the_task(services, run)


def test_the_agent_exiting_revokes_its_run_credential(client, services, run):
    assert works(client, run)
    stop_run(run.run_id)
    deadline = time.monotonic() + WAIT_S
    while not revoked(services, run.run_id):
        assert time.monotonic() < deadline, "agent exit never revoked the credential"
        time.sleep(0.05)
    assert not works(client, run)


def test_a_failed_launch_revokes_the_credential_it_issued(settings, member):
    from kandev_es.api import create_app
    from kandev_es.bootstrap import bootstrap

    broken = bootstrap(settings.with_overrides(agent_command="/nonexistent/agent-binary"))
    try:
        client = create_app(services=broken, run_projections=False).test_client()
        answer = create(client, member[1], title="no agent", start_agent=True)
        assert answer.status_code != 200
        assert answer.json["error"] == "agent_launch_failed"
        issued = [
            n for n in broken.app.recorder.select_notifications(start=1, limit=10_000)
            if n.topic.endswith("ApiToken.Issued") and b"run:" in n.state
        ]
        assert len(issued) == 1
        token = broken.app.load(issued[0].originator_id, ApiToken)
        assert token is not None and token.run_id is not None and token.revoked
    finally:
        broken.close()


def test_an_expired_run_credential_is_refused(services, run):
    assert services.tokens.authenticate_run(run.token, run.run_id) is not None
    assert TokenService(services.app, run_token_ttl=0).authenticate_run(
        run.token, run.run_id
    ) is None
