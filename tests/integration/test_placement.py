"""Where a create lands is decided in one module (creation/placement.py) for
REST, the Office runtime and MCP, and a subtask's parent is loaded once per
create: the load that places it is the one step 4 checks."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from kandev_es.mcp import handlers
from tests.conftest import bearer
from tests.integration.helpers import create
from tests.integration.runs import ROOT


@pytest.fixture
def parent_loads(services, monkeypatch):
    """How often each task id is loaded through the application (the real load
    runs; only the calls are counted)."""
    counted: Counter[uuid.UUID] = Counter()
    real = services.app.load

    def load(key, *args, **kwargs):
        counted[key] += 1
        return real(key, *args, **kwargs)

    monkeypatch.setattr(services.app, "load", load)
    return counted


def test_an_office_subtask_loads_its_parent_once(client, services, member, runs, parent_loads):
    _, secret = member
    parent = create(client, secret, title="parent").json
    run = runs.launch(client, secret)
    parent_loads.clear()

    answer = client.post(f"{ROOT}/{parent['id']}/subtasks", json={"title": "child"},
                         headers=run.headers())

    assert answer.status_code == 200 and answer.json["outcome"] == "created", answer.json
    assert answer.json["parent_id"] == parent["id"]
    assert answer.json["workspace_id"] == parent["workspace_id"]
    assert parent_loads[uuid.UUID(parent["id"])] == 1


def test_an_mcp_create_under_a_parent_lands_in_its_workspace_loading_it_once(
    client, services, workspace, admin, member, parent_loads
):
    services.workspaces.open("globex")  # two workspaces: the admin's default is ambiguous
    parent = create(client, member[1], title="parent").json
    principal = services.tokens.authenticate(admin[1])
    parent_loads.clear()

    child = handlers.create_task(
        services, principal, {"title": "child", "parent_id": parent["id"], "start_agent": False}
    )

    assert child["outcome"] == "created" and child["workspace_id"] == str(workspace.id)
    assert parent_loads[uuid.UUID(parent["id"])] == 1


def test_a_rest_create_loads_its_parent_once_and_lands_where_the_body_says(
    client, services, workspace, member, parent_loads
):
    _, secret = member
    parent = create(client, secret, title="parent").json
    parent_loads.clear()

    child = create(client, secret, title="child", parent_id=parent["id"]).json

    assert child["outcome"] == "created" and child["workspace_id"] == str(workspace.id)
    assert parent_loads[uuid.UUID(parent["id"])] == 1
    answer = client.get(f"/api/v1/tasks/{child['id']}", headers=bearer(secret))
    assert answer.json["parent_id"] == parent["id"]
