"""Members see no server configuration: the agent command's arguments, the
server's paths (data dir, worktrees, logs, registered repositories) and pids
stay out of what a member creator reads at ``/api/v1/creations/<handle>`` and
out of the auditor's page opened with an audit link; operators and admins see
the full evidence, and the stored events stay complete. Both backends, real
git repositories and real agent processes."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from kandev_es.domain.identity import Identity
from kandev_es.services.audit_links import LINK_PARAMETER
from kandev_es.services.history import identity_history
from tests.conftest import bearer
from tests.integration.helpers import create, make_git_repository

PAGE = "/audit/identities"


@pytest.fixture
def repo(client, workspace, operator, tmp_path):
    path = make_git_repository(tmp_path / "backend")
    answer = client.post(
        f"/api/v1/workspaces/{workspace.id}/repositories",
        json={"name": "backend", "path": str(path)},
        headers=bearer(operator[1]),
    )
    assert answer.status_code == 201, answer.json
    return path


def _launch(client, secret: str, external_id: str, agents: list[str]) -> dict[str, Any]:
    answer = create(
        client, secret, external_id=external_id, title="t",
        repositories=["backend"], start_agent=True,
    )
    assert answer.status_code == 200, answer.json
    agents.append(answer.json["id"])
    return answer.json


def _configuration(settings, tmp_path: Path) -> list[str]:
    """What a member must never read: every path under the test's root (the
    data dir, worktrees, logs, the registered repository) and each argument of
    the agent command."""
    return [str(tmp_path), str(settings.data_dir), *shlex.split(settings.agent_command)]


def _stored_launch(services, workspace, external_id: str) -> dict[str, Any]:
    from kandev_es.domain.external_id import identity_id

    identity = services.app.load(identity_id(workspace.id, external_id), Identity)
    return identity.tenure(1).steps["agent_launch"]["evidence"]


def test_a_member_creator_reads_its_steps_without_command_paths_or_pid(
    client, services, settings, workspace, member, repo, agents, tmp_path
):
    created = _launch(client, member[1], "D-1", agents)
    handle = created["creation_handle"]
    status = client.get(f"/api/v1/creations/{handle}", headers=bearer(member[1]))
    assert status.status_code == 200
    text = json.dumps(status.json)
    for secret_value in _configuration(settings, tmp_path):
        assert secret_value not in text, secret_value
    steps = {step["name"]: step for step in status.json["steps"]}
    launch = steps["agent_launch"]
    assert launch["status"] == "succeeded"
    assert set(launch["evidence"]) == {"run_id"}
    assert steps["repository:backend"]["evidence"]["branch"] == "kandev/KAN-1"
    assert "worktree" not in steps["repository:backend"]["evidence"]
    # The store keeps the whole evidence for auditors.
    stored = _stored_launch(services, workspace, "D-1")
    assert {"pid", "command", "cwd", "log"} <= set(stored)
    assert str(stored["pid"]) not in json.dumps(launch)


def test_an_operator_creator_reads_the_full_evidence(
    client, services, settings, workspace, operator, repo, agents
):
    created = _launch(client, operator[1], "D-2", agents)
    status = client.get(
        f"/api/v1/creations/{created['creation_handle']}", headers=bearer(operator[1])
    )
    steps = {step["name"]: step for step in status.json["steps"]}
    evidence = steps["agent_launch"]["evidence"]
    assert evidence == _stored_launch(services, workspace, "D-2")
    assert evidence["command"] == shlex.split(settings.agent_command)
    assert str(settings.data_dir) in evidence["log"]
    assert "worktree" in steps["repository:backend"]["evidence"]


def test_the_auditors_page_by_audit_link_shows_no_configuration_and_by_operator_token_all(
    client, services, settings, workspace, member, operator, repo, agents, tmp_path
):
    _launch(client, member[1], "D-3", agents)
    stored = _stored_launch(services, workspace, "D-3")
    link = services.audit_links.issue("http://x", workspace.id, "D-3", issued_by="test")
    secret = link.url.split(f"{LINK_PARAMETER}=", 1)[1]
    query = {"workspace": str(workspace.id), "external_id": "D-3"}
    by_link = client.get(PAGE, query_string={**query, LINK_PARAMETER: secret})
    assert by_link.status_code == 200
    html = by_link.get_data(as_text=True)
    assert "agent_launch" in html and "kandev/KAN-1" in html and stored["run_id"] in html
    for secret_value in _configuration(settings, tmp_path):
        assert secret_value not in html, secret_value
    assert f">{stored['pid']}<" not in html
    # The owning process (host:pid:...) is named only by its kind.
    assert services.settings is settings and ":" + str(stored["pid"]) not in html

    full = client.get(PAGE, query_string=query, headers=bearer(operator[1]))
    assert full.status_code == 200
    page = full.get_data(as_text=True)
    assert str(settings.data_dir) in page and f">{stored['pid']}<" in page
    history = client.get(
        f"/api/v1/workspaces/{workspace.id}/identities/history",
        query_string={"external_id": "D-3"},
        headers=bearer(operator[1]),
    )
    [recorded] = [
        e for e in history.json["events"]
        if e["event"] == "StepRecorded" and e["step"] == "agent_launch" and e["evidence"]
    ]
    assert recorded["evidence"] == stored


def test_a_failed_launch_tells_the_member_no_command_and_the_store_keeps_the_cause(
    settings, tmp_path
):
    from kandev_es.api import create_app
    from kandev_es.bootstrap import bootstrap

    missing = tmp_path / "nowhere" / "agent-binary"
    services = bootstrap(settings.with_overrides(agent_command=f"{missing} --secret-flag"))
    try:
        workspace = services.workspaces.open("acme")
        secret, _ = services.tokens.issue(workspace_id=workspace.id, admin=False)
        client = create_app(services=services, run_projections=False).test_client()
        answer = create(client, secret, external_id="D-4", title="t", start_agent=True)
        assert (answer.status_code, answer.json["error"]) == (502, "agent_launch_failed")
        assert str(tmp_path) not in json.dumps(answer.json)
        assert "--secret-flag" not in json.dumps(answer.json)
        history = identity_history(services.app, workspace.id, "D-4", full=True)
        [failed] = [e for e in history["events"] if e.get("status") == "failed"]
        assert failed["evidence"]["error"] == "agent_launch_failed"
        assert str(missing) in failed["evidence"]["detail"]
        redacted = identity_history(services.app, workspace.id, "D-4", full=False)
        assert str(tmp_path) not in json.dumps(redacted)
        [shown] = [e for e in redacted["events"] if e.get("status") == "failed"]
        assert shown["evidence"] == {"error": "agent_launch_failed"}
    finally:
        services.close()


def test_members_list_repository_names_and_operators_their_paths(
    client, workspace, member, operator, repo
):
    url = f"/api/v1/workspaces/{workspace.id}/repositories"
    assert client.get(url, headers=bearer(member[1])).json == [{"name": "backend"}]
    listed = client.get(url, headers=bearer(operator[1])).json
    assert listed == [{"name": "backend", "path": str(repo)}]
