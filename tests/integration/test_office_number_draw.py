"""Office numbers (``KAN-<n>``) are drawn only for creates that go on to
claim them. Where the store can (PostgreSQL), a first create whose snapshots
already admit it draws its number inside its lookup query, one round trip and
one commit fewer; the number is then drawn only if nothing the snapshots said
has moved. A retry, a refused create and a revoked token never use one up.
(The deletion landing after the draw: test_single_transaction_creates.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from kandev_es.domain.external_id import identity_id
from kandev_es.domain.identity import Identity
from tests.conftest import bearer

CREATE = "/api/v1/tasks"


def _create(client: Any, secret: str, workspace: Any, **fields: Any) -> Any:
    return client.post(
        CREATE, json={"workspace_id": str(workspace.id), "title": "t", **fields},
        headers=bearer(secret),
    )


def _number(response: Any) -> int:
    assert response.status_code in (200, 201), response.get_json()
    return int(response.get_json()["identifier"].rsplit("-", 1)[1])


def test_retries_and_refused_creates_never_use_up_an_office_number(client, member, workspace):
    _, secret = member
    first = _number(_create(client, secret, workspace, external_id="N-1"))
    for _ in range(3):
        again = _create(client, secret, workspace, external_id="N-1")
        assert again.get_json()["outcome"] == "found_settled"
    refused = [
        _create(client, secret, workspace, external_id="N-2", title=""),
        _create(client, secret, workspace, external_id="N-2", workflow="no-such-workflow"),
        _create(client, secret, workspace, external_id="N-2", repositories=["nope"]),
        _create(client, secret, workspace, external_id="x" * 100_000),
    ]
    assert [r.status_code // 100 for r in refused] == [4, 4, 4, 4]
    assert _number(_create(client, secret, workspace, external_id="N-3")) == first + 1


def test_a_revoked_token_draws_no_number(client, services, member, workspace):
    _, secret = member
    other, _ = services.tokens.issue(workspace_id=workspace.id, admin=False)
    first = _number(_create(client, secret, workspace, external_id="R-1"))
    token_id = services.tokens.authenticate(secret).token_id
    services.tokens.revoke(token_id)
    # This process's snapshot of the token still says it is valid: the
    # lookup reads its revocation, so no number is drawn for it.
    refused = _create(client, secret, workspace, external_id="R-2")
    assert refused.status_code in (401, 403, 404)  # not authorized: told nothing
    assert _number(_create(client, other, workspace, external_id="R-3")) == first + 1


def test_a_warm_first_create_draws_its_number_with_its_lookup(
    client, services, member, workspace, backend, monkeypatch
):
    _, secret = member
    first = _number(_create(client, secret, workspace, external_id="W-1"))
    separate: list[object] = []
    draw = services.app.next_office_number

    def counted(workspace_id: Any) -> int:
        separate.append(workspace_id)
        return draw(workspace_id)

    monkeypatch.setattr(services.app, "next_office_number", counted)
    second = _number(_create(client, secret, workspace, external_id="W-2"))
    assert second == first + 1
    # PostgreSQL draws in the lookup's query; SQLite's counter row is its own statement.
    assert len(separate) == (0 if backend == "postgres" else 1)


@pytest.mark.postgres_only  # only a store that draws with its reads admits by snapshots
def test_a_workspace_change_cached_after_admission_is_read_before_any_draw(
    client, services, member, operator, workspace, backend, monkeypatch
):
    # Another request thread may cache a newer workspace snapshot between the
    # admission by snapshots and the lookup: the draw is pinned to the
    # versions that admitted the body, so the create goes step by step and
    # honours the WIP limit set in between.
    _, secret = member
    _, operator_secret = operator
    first = _number(_create(client, secret, workspace, external_id="P-1"))
    service = services.creation
    admit = service._admitted_by_snapshots
    separate: list[object] = []
    draw = services.app.next_office_number

    def counted(workspace_id: Any) -> int:
        separate.append(workspace_id)
        return draw(workspace_id)

    def admitted_then_limit_set(*args: Any) -> Any:
        admitted = admit(*args)
        assert admitted is not None  # the snapshots admitted an effect-free create
        limited = client.put(
            f"/api/v1/workspaces/{workspace.id}/policy", json={"wip_limit": 5},
            headers=bearer(operator_secret),
        )
        assert limited.status_code == 200, limited.get_json()
        services.app.read_many([workspace.id])  # the newer snapshot, cached by "another thread"
        return admitted

    monkeypatch.setattr(services.app, "next_office_number", counted)
    monkeypatch.setattr(service, "_admitted_by_snapshots", admitted_then_limit_set)
    second = _create(client, secret, workspace, external_id="P-2")
    assert _number(second) == first + 1
    assert len(separate) == 1  # drawn on its own, after the lookup read the new limit
    identity = services.app.load(identity_id(workspace.id, "P-2"), Identity)
    assert identity is not None and identity.tenure(1).plan["wip_limit"] == 5
    assert identity.tenure(1).plan["steps"]  # the WIP reservation step
