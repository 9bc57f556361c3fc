"""AC-TASKS-EXTERNAL-ID-001.5: required effects run as durable typed steps —
real git branches and worktrees, attachment claims, WIP reservations, agent
sessions and real agent processes — and an aborted creation compensates every
one of them with proof."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from kandev_es.agent.processes import processes_for_run
from kandev_es.api import create_app
from kandev_es.bootstrap import bootstrap
from kandev_es.config import data_path
from kandev_es.domain.agent_session import session_id_for
from kandev_es.domain.wip import WipLedger, wip_ledger_id
from tests.conftest import bearer
from tests.integration import helpers
from tests.integration.helpers import branches, create, make_git_repository, worktrees


@pytest.fixture
def repo(client, workspace, operator, tmp_path):
    _, secret = operator
    path = make_git_repository(tmp_path / "backend")
    answer = client.post(
        f"/api/v1/workspaces/{workspace.id}/repositories",
        json={"name": "backend", "path": str(path)},
        headers=bearer(secret),
    )
    assert answer.status_code == 201, answer.json
    return path


def upload(client, workspace, secret, content: bytes, name: str = "spec.txt"):
    return helpers.upload(client, workspace, secret, content, name, "text/plain")


def test_repository_step_creates_a_branch_and_worktree(client, workspace, member, repo):
    _, secret = member
    answer = create(client, secret, external_id="R-1", title="t", repositories=["backend"])
    assert answer.status_code == 200, answer.json
    assert answer.json["outcome"] == "created"
    assert "kandev/KAN-1" in branches(repo)
    [worktree] = worktrees(repo)
    assert (Path(worktree) / "README.md").read_text() == "hello\n"
    retry = create(client, secret, external_id="R-1", title="t", repositories=["backend"])
    assert retry.json["outcome"] == "found_settled"
    assert branches(repo).count("kandev/KAN-1") == 1 and len(worktrees(repo)) == 1


def test_creation_handle_shows_steps_to_the_creator_only(client, services, workspace, member, repo):
    _, secret = member
    created = create(client, secret, external_id="H-1", title="t", repositories=["backend"])
    handle = created.json["creation_handle"]
    status = client.get(f"/api/v1/creations/{handle}", headers=bearer(secret))
    assert status.status_code == 200
    assert status.json["phase"] == "completed"
    [step] = status.json["steps"]
    assert (step["name"], step["status"]) == ("repository:backend", "succeeded")
    assert step["evidence"]["branch"] == "kandev/KAN-1"

    other_secret, _ = services.tokens.issue(workspace_id=workspace.id, admin=False)
    stranger = client.get(f"/api/v1/creations/{handle}", headers=bearer(other_secret))
    assert stranger.status_code == 404
    forged = handle.rsplit(".", 1)[0] + ".forged"
    assert client.get(f"/api/v1/creations/{forged}", headers=bearer(secret)).status_code == 404
    found = create(client, secret, external_id="H-1", title="t")
    assert "creation_handle" not in found.json


def test_attachment_is_claimed_by_exactly_one_task(client, services, workspace, member):
    _, secret = member
    attachment = upload(client, workspace, secret, b"the spec")
    again = upload(client, workspace, secret, b"the spec")
    assert again["id"] == attachment["id"]
    first = create(client, secret, external_id="AT-1", title="t", attachments=[attachment["id"]])
    assert first.status_code == 200
    claimed = services.attachments.get(workspace.id, attachment["id"])
    assert str(claimed.claimed_by) == first.json["id"]
    before = services.app.max_notification_id()
    second = create(client, secret, external_id="AT-2", title="t", attachments=[attachment["id"]])
    assert second.status_code == 409 and second.json["error"] == "attachment_claimed"
    assert services.app.max_notification_id() == before


def test_wip_limit_refuses_creates_but_still_answers_found(
    client, services, workspace, member, admin
):
    _, secret = member
    _, admin_secret = admin
    policy = client.put(
        f"/api/v1/workspaces/{workspace.id}/policy",
        json={"wip_limit": 1},
        headers=bearer(admin_secret),
    )
    assert policy.status_code == 200
    first = create(client, secret, external_id="W-1", title="t")
    assert first.json["outcome"] == "created"
    refused = create(client, secret, external_id="W-2", title="t")
    assert refused.status_code == 409 and refused.json["error"] == "capacity_exhausted"
    # The pre-insert re-read: a held identity is Found even at capacity.
    assert create(client, secret, external_id="W-1", title="t").json["outcome"] == "found_settled"
    client.post(f"/api/v1/tasks/{first.json['id']}/archive", headers=bearer(secret))
    assert create(client, secret, external_id="W-2", title="t").json["outcome"] == "created"


def test_start_agent_launches_one_real_process_in_the_worktree(
    client, services, workspace, member, repo, agents
):
    _, secret = member
    answer = create(
        client, secret, external_id="AG-1", title="t", repositories=["backend"], start_agent=True
    )
    assert answer.status_code == 200, answer.json
    agents.append(answer.json["id"])
    run_id = str(session_id_for(uuid.UUID(answer.json["id"])))
    assert len(processes_for_run(run_id)) == 1
    [worktree] = worktrees(repo)
    note = Path(worktree) / "KANDEV_AGENT.md"
    for _ in range(100):
        if note.exists():
            break
        __import__("time").sleep(0.05)
    assert answer.json["id"] in note.read_text()
    create(client, secret, external_id="AG-1", title="t", start_agent=True)
    assert len(processes_for_run(run_id)) == 1


def test_failed_launch_aborts_and_compensates_every_effect(
    client, services, settings, workspace, member, admin, repo, agents
):
    _, secret = member
    _, admin_secret = admin
    client.put(
        f"/api/v1/workspaces/{workspace.id}/policy",
        json={"wip_limit": 5},
        headers=bearer(admin_secret),
    )
    attachment = upload(client, workspace, secret, b"doomed")
    # A server whose agent command cannot start, on the same store.
    broken = bootstrap(settings.with_overrides(agent_command="/nonexistent/agent --go"))
    try:
        broken_client = create_app(services=broken, run_projections=False).test_client()
        answer = create(
            broken_client,
            secret,
            external_id="AB-1",
            title="t",
            repositories=["backend"],
            attachments=[attachment["id"]],
            start_agent=True,
        )
    finally:
        broken.close()
    assert answer.status_code == 502 and answer.json["error"] == "agent_launch_failed"
    assert branches(repo) == ["main"]
    assert worktrees(repo) == []
    # Nor the per-task folder the worktree was made in (issue 42, point 5).
    assert list(data_path(settings, "worktrees").iterdir()) == []
    assert services.attachments.get(workspace.id, attachment["id"]).claimed_by is None
    ledger = services.app.load(wip_ledger_id(workspace.id), WipLedger)
    assert ledger is not None and ledger.reserved == []
    lookup = client.get(
        f"/api/v1/workspaces/{workspace.id}/tasks/by-external-id",
        query_string={"external_id": "AB-1"},
        headers=bearer(secret),
    )
    assert lookup.status_code == 404
    # The identity is free again: a working create takes it.
    again = create(client, secret, external_id="AB-1", title="t", repositories=["backend"])
    assert again.json["outcome"] == "created"


def test_repository_registration_rejects_what_is_not_a_git_repository(
    client, workspace, operator, tmp_path
):
    _, secret = operator
    url = f"/api/v1/workspaces/{workspace.id}/repositories"
    for path in [str(tmp_path), "relative/path", str(tmp_path / "missing")]:
        answer = client.post(url, json={"name": "x", "path": path}, headers=bearer(secret))
        assert answer.status_code == 422


def test_agent_launch_compensation_stops_the_process_with_proof(services, settings, agents):
    from kandev_es.creation.steps.agent_launch import AgentLaunchStep
    from kandev_es.creation.steps.base import StepContext

    task_id = uuid.uuid4()
    agents.append(str(task_id))
    workspace = services.workspaces.open("agents")
    ctx = StepContext(
        services.app,
        settings,
        uuid.uuid4(),
        1,
        task_id,
        {"workspace_id": str(workspace.id), "repositories": []},
        services.tokens,
    )
    step = AgentLaunchStep()
    evidence = step.run(ctx)
    assert evidence["pid"] in processes_for_run(evidence["run_id"])
    assert Path(evidence["log"]).exists()
    assert step.run(ctx) == evidence, "a second run is the same launch, not a second agent"
    assert step.reconcile(ctx) == evidence
    step.compensate(ctx)
    assert step.absent(ctx)
    assert processes_for_run(evidence["run_id"]) == []
    assert step.reconcile(ctx) is None


def test_once_completing_a_creation_can_no_longer_abort():
    from datetime import UTC, datetime

    from kandev_es.domain.errors import DomainRuleBroken
    from kandev_es.domain.identity import Identity

    identity = Identity.register(uuid.uuid4(), uuid.uuid4(), "X")
    identity.claim(
        task_id=uuid.uuid4(),
        owner_id="o",
        actor="a",
        plan={},
        plan_hash="h",
        lease_expires_at=datetime.now(UTC),
    )
    identity.begin_completing(1)
    with pytest.raises(DomainRuleBroken):
        identity.begin_aborting(1, "late failure")
    assert identity.complete(1) == "created"


def test_another_node_compensates_a_repository_step_begun_under_the_first_nodes_data_dir(
    services, settings, tmp_path
):
    """A Runtime taking over a creation another API node began (its worktree is
    under that node's data dir) still removes the task's branch and worktree:
    git deletes no branch still checked out. A failover test once saw such a
    creation parked after five takeovers ("Cannot delete branch ... checked out")."""
    from kandev_es.creation.steps.base import StepContext
    from kandev_es.creation.steps.repository import RepositoryStep

    path = make_git_repository(tmp_path / "shared")
    workspace = services.workspaces.open("nodes")
    task_id = uuid.uuid4()
    manifest = {"workspace_id": str(workspace.id), "identifier": "NOD-1", "repositories": []}

    def context(data_dir: Path) -> StepContext:
        return StepContext(services.app, settings.with_overrides(data_dir=data_dir),
                           uuid.uuid4(), 1, task_id, manifest, services.tokens)

    first, second = context(tmp_path / "node-b"), context(tmp_path / "node-a")
    step = RepositoryStep("shared", str(path))
    evidence = step.run(first)
    assert Path(evidence["worktree"]).is_relative_to(tmp_path / "node-b")
    # The other node recognises it as made (issue 42, point 3) ...
    assert step.reconcile(second) == evidence
    step.compensate(second)
    assert step.absent(first) and step.absent(second)
    assert "kandev/NOD-1" not in branches(path)
    assert not Path(evidence["worktree"]).exists()
    # ... and removes the first node's per-task folder with it (point 5).
    assert not (tmp_path / "node-b" / "worktrees" / str(task_id)).exists()


def test_git_and_a_repositorys_hooks_get_no_server_secret(
    services, settings, workspace, tmp_path, monkeypatch
):
    """The repository step's git commands run the repository's hooks: they see
    the server's environment without its KANDEV_* settings (the database URL,
    tokens) or a libpq password."""
    from kandev_es.creation.steps.base import StepContext
    from kandev_es.creation.steps.repository import RepositoryStep

    monkeypatch.setenv("KANDEV_DATABASE_URL", "postgresql://kandev:s3cret-url@db/kandev")
    monkeypatch.setenv("PGPASSWORD", "s3cret-pg")
    path = make_git_repository(tmp_path / "hooked")
    seen = tmp_path / "hook-environment"
    hook = path / ".git" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\nenv > '{seen}'\n")
    hook.chmod(0o755)
    manifest = {"workspace_id": str(workspace.id), "identifier": "ENV-1", "repositories": []}
    ctx = StepContext(services.app, settings, uuid.uuid4(), 1, uuid.uuid4(), manifest,
                      services.tokens)
    step = RepositoryStep("hooked", str(path))
    step.run(ctx)
    try:
        names = {line.split("=", 1)[0] for line in seen.read_text().splitlines()}
        assert "s3cret" not in seen.read_text()
        assert not {name for name in names if name.startswith("KANDEV_")} and "PATH" in names
    finally:
        step.compensate(ctx)
    assert step.absent(ctx)
