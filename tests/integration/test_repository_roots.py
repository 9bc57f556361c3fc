"""Repository roots at create time: a repository registered while its path was
allowed is refused (422 repository_not_allowed, nothing created) once the
operator's roots no longer cover it."""

from __future__ import annotations

from kandev_es.api import create_app
from kandev_es.bootstrap import bootstrap
from tests.conftest import bearer
from tests.integration.helpers import make_git_repository


def test_a_create_rechecks_the_roots_of_its_repositories(settings, services, workspace, admin,
                                                        tmp_path):
    _, secret = admin
    repo = make_git_repository(tmp_path / "old-root" / "backend")
    services.repositories.register(workspace.id, "backend", str(repo))
    narrowed = bootstrap(settings.with_overrides(repository_roots=(tmp_path / "new-root",)))
    try:
        client = create_app(services=narrowed, run_projections=False).test_client()
        body = {"workspace_id": str(workspace.id), "title": "t", "repositories": ["backend"],
                "external_id": "ROOT-1"}
        refused = client.post("/api/v1/tasks", json=body, headers=bearer(secret))
        assert refused.status_code == 422 and refused.json["error"] == "repository_not_allowed"
        lookup = client.get(
            f"/api/v1/workspaces/{workspace.id}/tasks/by-external-id",
            query_string={"external_id": "ROOT-1"}, headers=bearer(secret),
        )
        assert lookup.status_code == 404
    finally:
        narrowed.close()
