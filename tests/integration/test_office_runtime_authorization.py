"""Run-authenticated creates accept only a run credential with its own run id:
anything else is 404 {"error": "task not created"}, before any validation,
and writes nothing. Runs on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid

import pytest

from kandev_es.domain.token import ApiToken
from kandev_es.errors import NOT_VALID_FOR_WORKSPACE
from kandev_es.services.auth import NO_BEARER_TOKEN
from tests.conftest import bearer
from tests.integration.runs import AGENTCTL, ROOT, RUN_ID_HEADER
from tests.support.errors import without_request_id

NOT_CREATED = {"error": "task not created", "message": NOT_VALID_FOR_WORKSPACE}
BODIES = [{"title": "t", "external_id": "AZ-1"}, {"title": ""}, {"external_id": "bad\x01"}]


@pytest.fixture
def other_run(client, services, runs):
    other = services.workspaces.open("other", "OTH")
    secret, _ = services.tokens.issue(workspace_id=other.id, admin=False)
    return runs.launch(client, secret)


def paths(run) -> list[str]:
    return [ROOT, f"{ROOT}/{run.task_id}/subtasks", AGENTCTL]


def assert_refused(client, services, path, headers, body, refusal=NOT_CREATED) -> None:
    before = services.app.max_notification_id()
    answer = client.post(path, json=body, headers=headers)
    assert answer.status_code == 404, answer.json
    assert without_request_id(answer.json) == refusal
    assert services.app.max_notification_id() == before


@pytest.mark.parametrize("body", BODIES)
def test_missing_or_wrong_run_id_header_is_not_created(body, client, services, run, other_run):
    wrong = [
        {"Authorization": f"Bearer {run.token}"},
        run.headers(run_id=other_run.run_id),
        run.headers(run_id=run.run_id + "x"),
        run.headers(run_id=" "),
    ]
    for path in paths(run):
        for headers in wrong:
            assert_refused(client, services, path, headers, body)


@pytest.mark.parametrize("body", BODIES)
def test_workspace_and_admin_tokens_are_not_run_credentials(
    body, client, services, member, admin, run
):
    for secret in (member[1], admin[1]):
        for path in paths(run):
            assert_refused(client, services, path, bearer(secret), body)
            headers = {**bearer(secret), RUN_ID_HEADER: run.run_id}
            assert_refused(client, services, path, headers, body)


def test_no_token_at_all_is_not_created(client, services, run):
    refusal = {"error": "task not created", "message": NO_BEARER_TOKEN}
    for path in paths(run):
        assert_refused(client, services, path, {RUN_ID_HEADER: run.run_id}, BODIES[0], refusal)


@pytest.mark.parametrize("body", BODIES)
def test_run_token_of_another_workspace_is_not_created(
    body, client, services, workspace, run, other_run
):
    # A root or agentctl create naming this workspace, as a run of the other one.
    # (A subtask of this workspace's task: test_a_parent_in_another_workspace_...)
    for path in (ROOT, AGENTCTL):
        named = {**body, "workspace_id": str(workspace.id)}
        assert_refused(client, services, path, other_run.headers(), named)


def test_a_held_identity_is_not_revealed_to_a_run_of_another_workspace(
    client, services, workspace, run, other_run
):
    made = client.post(ROOT, json={"title": "t", "external_id": "HID-1"}, headers=run.headers())
    assert made.json["outcome"] == "created"
    probe = {"title": "t", "external_id": "HID-1", "workspace_id": str(workspace.id)}
    assert_refused(client, services, AGENTCTL, other_run.headers(), probe)
    own = client.post(AGENTCTL, json={"title": "t", "external_id": "HID-1"},
                      headers=other_run.headers())
    assert own.json["outcome"] == "created" and own.json["id"] != made.json["id"]


def test_malformed_json_is_a_400_before_anything_else(client, services, run):
    before = services.app.max_notification_id()
    answer = client.post(
        AGENTCTL, data=b"{nope", headers={**run.headers(), "Content-Type": "application/json"}
    )
    assert answer.status_code == 400 and answer.json["error"] == "malformed_json"
    assert services.app.max_notification_id() == before


def test_tokens_issued_before_run_binding_replay_with_no_run(services, workspace):
    """An Issued event stored without run_id/task_id (older tokens) still loads."""
    token = ApiToken.issue("0" * 64, workspace.id, False, "old")
    [event] = token.collect_events()
    mapper = services.app.mapper
    stored = mapper.to_stored_event(event)
    state = mapper.transcoder.decode(stored.state)
    del state["run_id"], state["task_id"]
    old = type(stored)(
        originator_id=stored.originator_id,
        originator_version=stored.originator_version,
        topic=stored.topic,
        state=mapper.transcoder.encode(state),
    )
    replayed = mapper.to_domain_event(old).mutate(None)
    assert (replayed.run_id, replayed.task_id, replayed.workspace_id) == (None, None, workspace.id)


def test_a_parent_in_another_workspace_answers_as_an_unknown_parent(
    client, services, run, other_run
):
    """A run of the other workspace naming this workspace's task as parent gets
    exactly the answer an unknown parent gets, so task ids of another workspace
    are not revealed, and nothing is written in either workspace."""
    foreign = f"{ROOT}/{run.task_id}/subtasks"
    unknown = f"{ROOT}/{uuid.uuid4()}/subtasks"
    for body in ({"title": "t"}, {"title": "t", "external_id": "FP-1"}, {"title": ""}):
        before = services.app.max_notification_id()
        named = client.post(foreign, json=body, headers=other_run.headers())
        assert named.status_code == 422, named.json
        assert services.app.max_notification_id() == before
        guessed = client.post(unknown, json=body, headers=other_run.headers())
        assert named.status_code == guessed.status_code
        assert without_request_id(named.json) == without_request_id(guessed.json)
    parentless = client.post(foreign, json={"title": "t"}, headers=other_run.headers())
    assert parentless.json["error"] == "unknown_reference"
    assert "parent" in str(parentless.json)
    # The run's own held identity is still found under that parent, as under any.
    made = client.post(ROOT, json={"title": "t", "external_id": "FP-2"},
                       headers=other_run.headers())
    retry = client.post(foreign, json={"title": "t", "external_id": "FP-2"},
                        headers=other_run.headers())
    assert retry.json["outcome"] == "found_settled" and retry.json["id"] == made.json["id"]
