"""AC-TASKS-EXTERNAL-ID-001.4: after workspace authorization and external-ID
validation, the identity is resolved before any request-specific validation,
so a retry whose body has drifted still gets the Found answer, unchanged."""

from __future__ import annotations

import pytest

from tests.conftest import bearer
from tests.integration.helpers import create, start_unsettled_creation
from tests.support.errors import without_request_id

DRIFTED_BODIES = {
    "blank_title": {"title": "   "},
    "missing_title": {"title": None},
    "title_wrong_type": {"title": 12345},
    "title_too_long": {"title": "x" * 501},
    "unknown_workflow": {"workflow": "no-such-workflow"},
    "unknown_workflow_step": {"workflow_step": "nowhere"},
    "unknown_repository": {"repositories": ["ghost-repo"]},
    "repositories_wrong_type": {"repositories": "not-a-list"},
    "missing_attachment": {"attachments": ["sha256:deadbeef"]},
    "unknown_agent_profile": {"agent_profile": "nobody"},
    "unknown_parent": {"parent_id": "00000000-0000-0000-0000-000000000001"},
    "parent_not_a_uuid": {"parent_id": "nope"},
    "start_agent_wrong_type": {"start_agent": "maybe"},
    "unknown_field": {"colour": "purple"},
}


@pytest.mark.parametrize("drift", sorted(DRIFTED_BODIES))
def test_retry_with_invalid_payload_still_gets_found_and_original_task(
    drift, client, services, workspace, member
):
    _, secret = member
    original = create(client, secret, external_id="DRIFT-1", title="Original")
    assert original.json["outcome"] == "created"
    body = {"external_id": "DRIFT-1", "title": "Original", **DRIFTED_BODIES[drift]}
    if body["title"] is None:
        del body["title"]
    before = services.app.max_notification_id()

    retry = client.post("/api/v1/tasks", json=body, headers=bearer(secret))

    assert retry.status_code == 200, retry.json
    assert retry.json["outcome"] == "found_settled"
    assert retry.json["id"] == original.json["id"]
    per_answer = ("outcome", "deduplicated", "creation_handle")
    unchanged = {k: v for k, v in original.json.items() if k not in per_answer}
    assert {k: retry.json[k] for k in unchanged} == unchanged
    assert services.app.max_notification_id() == before


@pytest.mark.parametrize("drift", ["blank_title", "unknown_workflow", "missing_attachment"])
def test_the_same_drifted_body_on_a_miss_is_rejected(drift, client, services, member):
    _, secret = member
    body = {"external_id": "FRESH-1", "title": "t", **DRIFTED_BODIES[drift]}
    before = services.app.max_notification_id()
    answer = client.post("/api/v1/tasks", json=body, headers=bearer(secret))
    assert answer.status_code == 422
    assert services.app.max_notification_id() == before


def test_unsettled_holder_is_found_even_with_invalid_payload(client, services, workspace, member):
    _, secret = member
    in_flight = start_unsettled_creation(services, workspace, "DRIFT-2")
    answer = create(client, secret, external_id="DRIFT-2", workflow="gone", title="")
    assert answer.status_code == 200
    assert answer.json["outcome"] == "found_unsettled"
    assert answer.json["id"] == str(in_flight.id)


def test_lookup_route_has_no_side_effects(client, services, workspace, member):
    _, secret = member
    created = create(client, secret, external_id="LOOK-1", title="t")
    before = services.app.max_notification_id()
    url = f"/api/v1/workspaces/{workspace.id}/tasks/by-external-id"
    found = client.get(url, query_string={"external_id": "LOOK-1"}, headers=bearer(secret))
    missing = client.get(url, query_string={"external_id": "LOOK-2"}, headers=bearer(secret))
    bad = client.get(url, query_string={"external_id": "a\x00b"}, headers=bearer(secret))
    absent = client.get(url, headers=bearer(secret))
    assert found.status_code == 200
    assert found.json["id"] == created.json["id"]
    assert found.json["creation_complete"] is True
    assert missing.status_code == 404, missing
    assert without_request_id(missing.json) == {"error": "task not found"}
    assert bad.status_code == 400 and bad.json["error"] == "invalid_external_id"
    assert absent.status_code == 400
    assert services.app.max_notification_id() == before


def test_lookup_reports_unsettled_creation(client, services, workspace, member):
    _, secret = member
    start_unsettled_creation(services, workspace, "LOOK-3")
    url = f"/api/v1/workspaces/{workspace.id}/tasks/by-external-id"
    found = client.get(url, query_string={"external_id": "LOOK-3"}, headers=bearer(secret))
    assert found.status_code == 200
    assert found.json["creation_complete"] is False


def test_lookup_takes_the_workspace_name_as_the_cli_does(client, services, workspace, member):
    _, secret = member
    other = services.workspaces.open("other", "OTH")
    other_workspace_secret, _ = services.tokens.issue(workspace_id=other.id, admin=False)
    created = create(client, secret, external_id="LOOK-N", title="t")
    by_name = f"/api/v1/workspaces/{workspace.name}/tasks/by-external-id"
    found = client.get(by_name, query_string={"external_id": "LOOK-N"}, headers=bearer(secret))
    assert found.status_code == 200 and found.json["id"] == created.json["id"]
    # Another workspace's token, nobody, or a name no workspace has: the same 404.
    for headers, path in [
        (bearer(other_workspace_secret), by_name),
        ({}, by_name),
        (bearer(secret), "/api/v1/workspaces/no-such-workspace/tasks/by-external-id"),
    ]:
        answer = client.get(path, query_string={"external_id": "LOOK-N"}, headers=headers)
        assert answer.status_code == 404
        assert without_request_id(answer.json) == {"error": "task not found"}
