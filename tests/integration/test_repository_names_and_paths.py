"""A registered repository is what it claims to be: its name matches the name
rule in full (no trailing newline) and its path is the top of its own git work
tree. A folder inside an enclosing clone is refused at registration (422
repository_not_top_level) and again by the repository step before any git
command, so nothing of a creation lands in the enclosing repository."""

from __future__ import annotations

import subprocess

from kandev_es.domain.workspace import Workspace
from tests.conftest import bearer
from tests.integration.helpers import branches, create, make_git_repository, worktrees


def register(client, workspace, secret, name, path):
    return client.post(
        f"/api/v1/workspaces/{workspace.id}/repositories",
        json={"name": name, "path": str(path)},
        headers=bearer(secret),
    )


def kandev_config(path) -> str:
    return subprocess.run(
        ["git", "-C", str(path), "config", "--get-regexp", "kandevtask"],
        capture_output=True, text=True, check=False,
    ).stdout


def test_a_repository_name_with_a_trailing_newline_is_refused(
    client, services, workspace, operator, tmp_path
):
    _, secret = operator
    repo = make_git_repository(tmp_path / "inbox")
    before = services.app.max_notification_id()
    for name in ("inbox\n", "inbox\r\n", "inbox\n\n"):
        refused = register(client, workspace, secret, name, repo)
        assert refused.status_code == 422, refused.json
        assert refused.json["error"] == "validation_failed"
    assert services.app.max_notification_id() == before
    assert register(client, workspace, secret, "inbox", repo).status_code == 201


def test_a_folder_inside_an_enclosing_work_tree_is_refused(
    client, services, workspace, operator, tmp_path
):
    _, secret = operator
    enclosing = make_git_repository(tmp_path / "clone")
    folder = enclosing / "repos" / "inbox"
    folder.mkdir(parents=True)
    before = services.app.max_notification_id()
    refused = register(client, workspace, secret, "inbox", folder)
    assert refused.status_code == 422, refused.json
    assert refused.json["error"] == "repository_not_top_level"
    assert services.app.max_notification_id() == before
    # A repository of its own nested inside the clone is its own top: accepted.
    nested = make_git_repository(enclosing / "repos" / "backend")
    assert register(client, workspace, secret, "backend", nested).status_code == 201


def test_the_repository_step_refuses_a_folder_registered_before_the_check(
    client, services, workspace, member, tmp_path
):
    _, secret = member
    enclosing = make_git_repository(tmp_path / "clone")
    folder = enclosing / "repos" / "inbox"
    folder.mkdir(parents=True)
    # As an earlier version stored it, before registration checked the top.
    stored = services.app.load(workspace.id, Workspace)
    stored.register_repository("inbox", str(folder))
    services.app.save_atomically(stored)

    answer = create(client, secret, external_id="ENC-1", title="t", repositories=["inbox"])
    assert answer.status_code == 422, answer.json
    assert answer.json["error"] == "repository_not_top_level"
    lookup = client.get(
        f"/api/v1/workspaces/{workspace.id}/tasks/by-external-id",
        query_string={"external_id": "ENC-1"},
        headers=bearer(secret),
    )
    assert lookup.status_code == 404  # aborted: the identity is free
    assert branches(enclosing) == ["main"]
    assert worktrees(enclosing) == []
    assert kandev_config(enclosing) == ""
