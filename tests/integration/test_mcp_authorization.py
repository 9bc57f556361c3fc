"""Authorization over MCP: the token decides the workspace;
a refused create is the fixed 404 "task not created" and writes nothing, even
for an identity that is held — it never reveals that a task exists. A missing
or unknown KANDEV_TOKEN is tried on the real `kandev-es mcp` process over stdio
(the token is its environment's); the other cases connect to the same server
in-process (tests/support/mcp_client.py)."""

from __future__ import annotations

import uuid

import pytest

from kandev_es.errors import NOT_VALID_FOR_WORKSPACE
from tests.support.errors import without_request_id
from tests.support.mcp_client import call, mcp_in_process, mcp_stdio

pytestmark = pytest.mark.anyio
CREATE = "create_task_kandev"


@pytest.fixture
def outsider(services):
    globex = services.workspaces.open("globex")
    secret, _ = services.tokens.issue(workspace_id=globex.id, admin=False)
    return globex, secret


async def test_token_of_another_workspace_cannot_create_and_writes_nothing(
    settings, services, workspace, member, outsider
):
    _, secret = member
    _, stranger = outsider
    async with mcp_in_process(settings, secret) as client:
        error, held = await call(client, CREATE, title="Mine", external_id="HELD-1",
                                 start_agent=False)
    assert not error and held["outcome"] == "created"
    before = services.app.max_notification_id()
    async with mcp_in_process(settings, stranger) as client:
        fresh_error, fresh = await call(
            client, CREATE, title="t", external_id="NEW-1", workspace_id=str(workspace.id)
        )
        held_error, probe = await call(
            client, CREATE, title="t", external_id="HELD-1", workspace_id=str(workspace.id)
        )
    assert fresh_error and held_error
    assert without_request_id(fresh) == without_request_id(probe) == {
        "error": "task not created", "message": NOT_VALID_FOR_WORKSPACE, "status": 404
    }
    assert services.app.max_notification_id() == before


async def test_parent_in_a_workspace_the_token_cannot_act_on_is_not_used(
    settings, services, workspace, member, outsider
):
    _, stranger = outsider
    _, secret = member
    async with mcp_in_process(settings, secret) as client:
        _, parent = await call(client, CREATE, title="Parent", start_agent=False)
    async with mcp_in_process(settings, stranger) as client:
        error, body = await call(client, CREATE, title="Child", parent_id=parent["id"],
                                 start_agent=False)
    # Resolution fell back to the token's own workspace, where no such parent exists.
    assert error and (body["error"], body["status"]) == ("unknown_reference", 422)


@pytest.mark.parametrize("token", [None, "kes_not-a-real-token", "garbage"])
async def test_missing_or_unknown_token_is_refused_without_writing(
    settings, services, workspace, token
):
    before = services.app.max_notification_id()
    async with mcp_stdio(settings, token) as client:
        create_error, create = await call(
            client, CREATE, title="t", external_id="E-1", workspace_id=str(workspace.id)
        )
        list_error, listing = await call(client, "list_tasks", workspace_id=str(workspace.id))
    assert create_error, create_error
    assert without_request_id(create) == {
        "error": "task not created", "message": NOT_VALID_FOR_WORKSPACE, "status": 404
    }
    assert list_error and without_request_id(listing) == {"error": "task not found", "status": 404}
    assert services.app.max_notification_id() == before


async def test_token_of_another_workspace_cannot_read_list_or_update_a_task(
    settings, services, workspace, member, outsider
):
    _, secret = member
    _, stranger = outsider
    async with mcp_in_process(settings, secret) as client:
        _, task = await call(client, CREATE, title="Private", external_id="P-1", start_agent=False)
    before = services.app.max_notification_id()
    async with mcp_in_process(settings, stranger) as client:
        answers = [
            await call(client, "get_task", task_id=task["id"]),
            await call(client, "update_task", task_id=task["id"], title="Hijacked"),
            await call(client, "list_tasks", workspace_id=str(workspace.id)),
        ]
    for error, body in answers:
        assert error and without_request_id(body) == {"error": "task not found", "status": 404}
    assert services.app.max_notification_id() == before


async def test_admin_token_resolves_the_only_workspace_then_needs_one_when_several(
    settings, services, workspace, admin
):
    _, secret = admin
    async with mcp_in_process(settings, secret) as client:
        _, only = await call(client, CREATE, title="Lands in acme", start_agent=False)
        globex = services.workspaces.open("globex")
        ambiguous_error, ambiguous = await call(client, CREATE, title="Where?", start_agent=False)
        _, explicit = await call(client, CREATE, title="Globex", workspace_id=str(globex.id),
                                 external_id="G-1", start_agent=False)
        _, child = await call(client, CREATE, title="Sub", parent_id=explicit["id"],
                              start_agent=False)
    assert only["workspace_id"] == str(workspace.id)
    assert ambiguous_error and without_request_id(ambiguous) == {
        "error": "task not created", "message": NOT_VALID_FOR_WORKSPACE, "status": 404
    }
    assert explicit["workspace_id"] == str(globex.id)
    # The parent's workspace is used, and its external_id is never inherited.
    assert child["workspace_id"] == str(globex.id) and child["parent_id"] == explicit["id"]
    assert "external_id" not in child and child["outcome"] == "created"


def test_the_only_workspace_scan_goes_through_the_store_breaker(
    settings, services, workspace, admin
):
    """With the breaker open, resolving the default workspace
    is refused with the typed 503 like every other store call, not read around it."""
    from kandev_es.application import Tasks
    from kandev_es.creation.placement import only_live
    from kandev_es.domain.principal import Principal
    from kandev_es.errors import StoreUnavailable
    from kandev_es.storage.breaker import StoreBreaker

    principal, _ = admin
    # A workspace token of a workspace never opened: the scan picks nothing for
    # it and loads no workspace, so only the scan itself can meet the breaker.
    stranger = Principal(token_id=uuid.uuid4(), admin=False, workspace_id=uuid.uuid4())
    breaker = StoreBreaker(probe_interval=3600)
    app = Tasks(settings, breaker=breaker)
    try:
        assert only_live(app, principal) == workspace.id
        assert only_live(app, stranger) is None
        breaker.failed("connection refused")
        for caller in (principal, stranger):
            with pytest.raises(StoreUnavailable):
                only_live(app, caller)
    finally:
        app.close()
