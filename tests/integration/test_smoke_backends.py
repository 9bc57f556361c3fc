"""Both backends wire up and answer Created then Found."""

from tests.conftest import bearer


def test_retry_with_same_external_id_returns_the_same_task(client, workspace, member):
    _, secret = member
    body = {"workspace_id": str(workspace.id), "external_id": "JIRA-1", "title": "First"}
    first = client.post("/api/v1/tasks", json=body, headers=bearer(secret))
    second = client.post("/api/v1/tasks", json=body, headers=bearer(secret))
    assert first.status_code == second.status_code == 200
    assert first.json["outcome"] == "created"
    assert second.json["outcome"] == "found_settled"
    assert second.json["id"] == first.json["id"]
