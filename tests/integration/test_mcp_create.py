"""create_task_kandev against the server `kandev-es mcp` runs: the outcomes
(AC-1/2/3), lookup before validation (AC-4), bad external IDs, no
auto-generated external_id. The first test drives the real process over stdio;
the others connect to the same server in-process (tests/support/mcp_client.py).
Runs on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from tests.conftest import bearer
from tests.integration.helpers import start_unsettled_creation, task_created_count
from tests.support.mcp_client import call, mcp_in_process, mcp_stdio

pytestmark = pytest.mark.anyio
CREATE = "create_task_kandev"


async def test_new_external_id_is_created_and_retry_is_found_settled(
    settings, services, workspace, member
):
    _, secret = member
    async with mcp_stdio(settings, secret) as client:
        error, first = await call(client, CREATE, title="Fix login", external_id="JIRA-1")
        before = services.app.max_notification_id()
        again_error, retry = await call(client, CREATE, title="Fix login", external_id="JIRA-1")
    assert not error and not again_error
    assert (first["outcome"], first["deduplicated"], first["creation_complete"]) == (
        "created", False, True,
    )
    assert (retry["outcome"], retry["deduplicated"], retry["creation_complete"]) == (
        "found_settled", True, True,
    )
    assert retry["id"] == first["id"] and retry["external_id"] == "JIRA-1"
    assert "creation_handle" in first and "creation_handle" not in retry
    assert services.app.max_notification_id() == before  # Found wrote nothing
    assert task_created_count(services) == 1


async def test_result_is_the_body_the_rest_api_returns(settings, services, client, member):
    _, secret = member
    async with mcp_in_process(settings, secret) as mcp:
        _, created = await call(mcp, CREATE, title="Same body", external_id="E-REST")
        _, found = await call(mcp, CREATE, title="Same body", external_id="E-REST")
    rest = client.post(
        "/api/v1/tasks", json={"title": "x", "external_id": "E-REST"}, headers=bearer(secret)
    )
    assert rest.status_code == 200
    assert found == rest.json
    assert {k: v for k, v in created.items() if k != "creation_handle"}.keys() == found.keys()


async def test_found_unsettled_returns_the_in_flight_task_and_never_release_advice(
    settings, services, workspace, member
):
    _, secret = member
    in_flight = start_unsettled_creation(services, workspace, "E-3")
    before = services.app.max_notification_id()
    async with mcp_in_process(settings, secret) as client:
        error, answer = await call(client, CREATE, title="Retry", external_id="E-3")
    assert not error
    assert (answer["outcome"], answer["deduplicated"], answer["creation_complete"]) == (
        "found_unsettled", True, False,
    )
    assert answer["id"] == str(in_flight.id) and answer["state"] == "preparing"
    assert "never release" in answer["advice"].lower()
    assert "creation_handle" not in answer
    assert services.app.max_notification_id() == before


async def test_without_external_id_every_create_is_new_and_none_is_generated(
    settings, services, workspace, member
):
    _, secret = member
    async with mcp_in_process(settings, secret) as client:
        _, one = await call(client, CREATE, title="Same", start_agent=False)
        _, two = await call(client, CREATE, title="Same", start_agent=False)
        _, read = await call(client, "get_task", task_id=one["id"])
    assert one["outcome"] == two["outcome"] == "created"
    assert one["id"] != two["id"]
    assert "external_id" not in one and "external_id" not in two and "external_id" not in read


async def test_start_agent_defaults_to_true(settings, services, workspace, member):
    _, secret = member
    async with mcp_in_process(settings, secret) as client:
        error, task = await call(client, CREATE, title="With an agent", external_id="AGENT-1")
    assert not error, task
    assert task["start_agent"] is True and task["outcome"] == "created"


@pytest.mark.parametrize(
    "drift",
    [
        {"title": ""},
        {"title": 123},
        {},  # title missing altogether
        {"title": "ok", "workflow": "no-such-workflow"},
        {"title": "ok", "workflow_step": "nowhere"},
        {"title": "ok", "repositories": ["not-registered"]},
        {"title": "ok", "parent_id": "not-a-uuid"},
        {"title": "ok", "unexpected": True},
    ],
    ids=["blank", "number", "missing", "workflow", "step", "repo", "parent", "unknown-field"],
)
async def test_retry_with_invalid_payload_still_finds_the_original(
    settings, services, workspace, member, drift
):
    _, secret = member
    async with mcp_in_process(settings, secret) as client:
        _, original = await call(client, CREATE, title="Original", external_id="E-4",
                                 start_agent=False)
        before = services.app.max_notification_id()
        error, retry = await call(client, CREATE, external_id="E-4", **drift)
    assert not error, retry
    assert retry["outcome"] == "found_settled"
    assert retry["id"] == original["id"] and retry["title"] == "Original"
    assert services.app.max_notification_id() == before


async def test_invalid_payload_for_a_free_identity_is_a_typed_error_writing_nothing(
    settings, services, workspace, member
):
    _, secret = member
    async with mcp_in_process(settings, secret) as client:
        before = services.app.max_notification_id()
        blank_error, blank = await call(client, CREATE, title="  ", external_id="FREE-1")
        flow_error, flow = await call(client, CREATE, title="t", workflow="nope",
                                      external_id="FREE-2")
    assert blank_error and (blank["error"], blank["status"]) == ("validation_failed", 422)
    assert flow_error and (flow["error"], flow["status"]) == ("unknown_reference", 422)
    assert services.app.max_notification_id() == before


@pytest.mark.parametrize(
    "bad, reason",
    [
        ("JIRA\x00-1", "control_character"),
        ("\x1fJIRA-1", "control_character"),
        ("x" * 256, "too_long"),
        ("é" * 128, "too_long"),  # 256 UTF-8 bytes
        (42, "not_a_string"),
    ],
    ids=["nul", "leading-control", "256-ascii", "256-bytes", "number"],
)
async def test_bad_external_id_is_a_typed_error_and_writes_nothing(
    settings, services, workspace, member, bad, reason
):
    _, secret = member
    before = services.app.max_notification_id()
    async with mcp_in_process(settings, secret) as client:
        error, body = await call(client, CREATE, title="t", external_id=bad)
    assert error
    assert (body["error"], body["status"], body["details"]["reason"]) == (
        "invalid_external_id", 400, reason,
    )
    assert services.app.max_notification_id() == before


async def test_external_id_reaches_the_protocol_byte_exact(settings, services, workspace, member):
    """The SDK's high-level server would JSON-decode list-looking strings; ours doesn't."""
    _, secret = member
    async with mcp_in_process(settings, secret) as client:
        _, listy = await call(client, CREATE, title="t", external_id='["a", "b"]',
                              start_agent=False)
        _, cased = await call(client, CREATE, title="t", external_id="Jira-1", start_agent=False)
        _, upper = await call(client, CREATE, title="t", external_id="JIRA-1", start_agent=False)
    assert listy["outcome"] == "created" and listy["external_id"] == '["a", "b"]'
    assert cased["id"] != upper["id"] and upper["outcome"] == "created"
