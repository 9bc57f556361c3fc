"""Office numbers (``KAN-<n>``) are drawn only for creates that go on to
claim them. Where the store can (PostgreSQL), a first create whose snapshots
already admit it draws its number inside its lookup query, one round trip and
one commit fewer; the number is then drawn only if nothing the snapshots said
has moved. A retry, a refused create and a revoked token never use one up.
(The deletion landing after the draw: test_single_transaction_creates.py.)"""

from __future__ import annotations

from typing import Any

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
