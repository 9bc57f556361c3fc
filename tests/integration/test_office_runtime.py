"""Office runtime root/subtask creates and the agentctl taskCreate route, with
the run credential of a real agent launch: the four outcomes (AC-1/2/3),
lookup before validation (AC-4), bad external IDs, subtasks that inherit no
external_id. Runs on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid

import pytest

from tests.conftest import bearer
from tests.integration.helpers import create, start_unsettled_creation, task_created_count
from tests.integration.runs import AGENTCTL, ROOT

ROUTES = ["root", "subtask", "agentctl"]


def path_for(route: str, run) -> str:
    if route == "subtask":
        return f"{ROOT}/{run.task_id}/subtasks"
    return ROOT if route == "root" else AGENTCTL


def test_run_token_from_agent_launch_is_bound_to_its_run_and_task(services, workspace, run):
    # Off the run routes a run credential is no principal at all.
    assert services.tokens.authenticate(run.token) is None
    principal = services.tokens.authenticate_run(run.token, run.run_id)
    assert principal.run_id == run.run_id
    assert str(principal.task_id) == run.task_id
    assert principal.workspace_id == workspace.id and not principal.admin


def test_workspace_and_admin_tokens_carry_no_run(services, member, admin):
    for secret in (member[1], admin[1]):
        principal = services.tokens.authenticate(secret)
        assert principal.run_id is None and principal.task_id is None


@pytest.mark.parametrize("route", ROUTES)
def test_new_external_id_is_created_and_retry_is_found_settled_unchanged(
    route, client, services, member, run
):
    path = path_for(route, run)
    first = client.post(path, json={"title": "sub", "external_id": "OR-1"}, headers=run.headers())
    assert first.status_code == 200, first.json
    assert (first.json["outcome"], first.json["deduplicated"], first.json["creation_complete"]) == (
        "created", False, True,
    )
    assert first.json["external_id"] == "OR-1" and "creation_handle" in first.json
    before = services.app.max_notification_id()
    retry = client.post(
        path, json={"title": "other", "external_id": "OR-1"}, headers=run.headers()
    )
    assert (retry.json["outcome"], retry.json["deduplicated"], retry.json["creation_complete"]) == (
        "found_settled", True, True,
    )
    assert retry.json["id"] == first.json["id"] and retry.json["title"] == "sub"
    assert "creation_handle" not in retry.json
    assert services.app.max_notification_id() == before
    # The same answer the REST create gives for the same identity.
    assert create(client, member[1], external_id="OR-1", title="x").json == retry.json


@pytest.mark.parametrize("route", ROUTES)
def test_in_flight_identity_is_found_unsettled_without_side_effects(
    route, client, services, workspace, run
):
    in_flight = start_unsettled_creation(services, workspace, "OR-2")
    before = services.app.max_notification_id()
    answer = client.post(
        path_for(route, run), json={"title": "t", "external_id": "OR-2"}, headers=run.headers()
    )
    assert answer.status_code == 200
    assert (answer.json["outcome"], answer.json["deduplicated"]) == ("found_unsettled", True)
    assert answer.json["creation_complete"] is False and "advice" in answer.json
    assert answer.json["id"] == str(in_flight.id)
    assert services.app.max_notification_id() == before


@pytest.mark.parametrize("route", ROUTES)
def test_without_external_id_every_create_is_a_new_task(route, client, services, run):
    path = path_for(route, run)
    before = task_created_count(services)
    ids = {client.post(path, json={"title": "t"}, headers=run.headers()).json["id"] for _ in "ab"}
    assert len(ids) == 2
    assert task_created_count(services) == before + 2


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    "drift",
    [
        {"title": ""},
        {"workflow": "nope"},
        {"repositories": ["missing"]},
        {"attachments": ["sha256:" + "0" * 64]},
        {"agent_profile": "ghost"},
        {"unexpected": 1},
    ],
)
def test_retry_with_invalid_fields_for_a_held_identity_is_found_settled(
    route, drift, client, services, run
):
    path = path_for(route, run)
    first = client.post(path, json={"title": "t", "external_id": "LB-1"}, headers=run.headers())
    before = services.app.max_notification_id()
    retry = client.post(path, json={"external_id": "LB-1", **drift}, headers=run.headers())
    assert retry.status_code == 200, retry.json
    assert retry.json["outcome"] == "found_settled" and retry.json["id"] == first.json["id"]
    assert services.app.max_notification_id() == before


def test_subtask_retry_under_an_unknown_parent_still_finds_the_held_identity(client, run):
    made = client.post(
        f"{ROOT}/{run.task_id}/subtasks", json={"title": "t", "external_id": "LB-2"},
        headers=run.headers(),
    )
    for parent in (str(uuid.uuid4()), "not-a-uuid"):
        retry = client.post(
            f"{ROOT}/{parent}/subtasks", json={"title": "t", "external_id": "LB-2"},
            headers=run.headers(),
        )
        assert retry.json["outcome"] == "found_settled" and retry.json["id"] == made.json["id"]
    unknown = f"{ROOT}/{uuid.uuid4()}/subtasks"
    fresh = client.post(unknown, json={"title": "t"}, headers=run.headers())
    assert fresh.status_code == 422 and fresh.json["error"] == "unknown_reference"


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("bad", ["bad\x01id", "tab\tinside", "x" * 256, "\x7f"])
def test_bad_external_id_is_a_typed_400_and_writes_nothing(route, bad, client, services, run):
    before = services.app.max_notification_id()
    answer = client.post(
        path_for(route, run), json={"title": "t", "external_id": bad}, headers=run.headers()
    )
    assert answer.status_code == 400 and answer.json["error"] == "invalid_external_id"
    assert services.app.max_notification_id() == before


def test_subtask_has_its_parent_and_never_inherits_the_parent_external_id(
    client, member, runs
):
    _, secret = member
    parent = create(client, secret, title="parent", external_id="PARENT-1").json
    run = runs.launch(client, secret)
    answer = client.post(f"{ROOT}/{parent['id']}/subtasks", json={"title": "child"},
                         headers=run.headers())
    assert answer.json["outcome"] == "created"
    assert answer.json["parent_id"] == parent["id"]
    assert "external_id" not in answer.json
    stored = client.get(f"/api/v1/tasks/{answer.json['id']}", headers=bearer(secret)).json
    assert stored["parent_id"] == parent["id"] and "external_id" not in stored
    # The parent's external_id still names the parent alone.
    again = create(client, secret, title="x", external_id="PARENT-1").json
    assert again["id"] == parent["id"] and again["outcome"] == "found_settled"


def test_subtask_route_overrides_parent_and_workspace_from_the_body(client, workspace, run):
    answer = client.post(
        f"{ROOT}/{run.task_id}/subtasks",
        json={"title": "t", "parent_id": str(uuid.uuid4()), "workspace_id": str(uuid.uuid4())},
        headers=run.headers(),
    )
    assert answer.status_code == 200, answer.json
    assert answer.json["parent_id"] == run.task_id
    assert answer.json["workspace_id"] == str(workspace.id)
