"""One workspace representation: REST answers with what the workspace service
holds (views.workspace_dto, the dump of WorkspaceSchema, which OpenAPI
publishes), its WIP limit and repository names included."""

from __future__ import annotations

from tests.conftest import bearer
from tests.integration.helpers import make_git_repository


def test_rest_shows_the_workspaces_wip_limit_and_repository_names(
    client, services, workspace, member, operator, tmp_path
):
    _, operator_secret = operator
    for name in ("zeta", "alpha"):
        registered = client.post(
            f"/api/v1/workspaces/{workspace.id}/repositories",
            json={"name": name, "path": str(make_git_repository(tmp_path / name))},
            headers=bearer(operator_secret),
        )
        assert registered.status_code == 201, registered.json
    policy = client.put(
        f"/api/v1/workspaces/{workspace.id}/policy",
        json={"wip_limit": 3},
        headers=bearer(operator_secret),
    )
    assert policy.status_code == 200, policy.json

    _, secret = member
    answer = client.get(f"/api/v1/workspaces/{workspace.id}", headers=bearer(secret))

    assert answer.status_code == 200, answer.json
    assert answer.json["wip_limit"] == 3
    assert answer.json["repositories"] == ["alpha", "zeta"]  # names only, sorted
    from kandev_es.views import workspace_dto

    assert answer.json == workspace_dto(services.workspaces.get(workspace.id))


def test_a_new_workspace_answers_with_no_wip_limit_and_no_repositories(client, admin):
    _, secret = admin
    answer = client.post("/api/v1/workspaces", json={"name": "fresh"}, headers=bearer(secret))

    assert answer.status_code == 201, answer.json
    assert answer.json["wip_limit"] is None and answer.json["repositories"] == []
    assert set(answer.json) == {
        "id", "name", "task_prefix", "workflows", "wip_limit", "repositories"
    }
