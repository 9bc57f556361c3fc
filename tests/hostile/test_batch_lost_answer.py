"""A batch whose save committed but whose answer was lost (issue 44 point 7):
a real TCP proxy (tests/support/pg_proxy.py) drops the connection after the
batch's save statement reached PostgreSQL and before its answer came back.
The batch answers created once per item, no office number is drawn twice, and
the same batch again (with or without its Idempotency-Key) makes nothing more.
PostgreSQL only: an embedded SQLite has no connection to lose."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kandev_es.bootstrap import Services, bootstrap
from tests.support.pg_proxy import PgProxy

pytestmark = pytest.mark.postgres_only

CLAIM = b"Identity.Registered"


@pytest.fixture
def proxied(settings) -> Iterator[tuple[Services, PgProxy]]:
    services = bootstrap(settings)  # tables made directly, not through the proxy
    services.close()
    proxy, url = PgProxy.before(settings.database_url)
    through = bootstrap(settings.with_overrides(database_url=url, runtime_in_process=False))
    yield through, proxy
    through.close()
    proxy.close()


def test_a_batch_save_committed_with_its_answer_lost_answers_created_once(proxied):
    services, proxy = proxied
    workspace = services.workspaces.open("lost")
    _, principal = services.tokens.issue(workspace_id=workspace.id, admin=False)
    body = {"tasks": [{"external_id": f"LB-{n}", "title": f"t{n}"} for n in range(30)]}

    proxy.lose_answer(CLAIM)
    first = services.batch.create_many(principal, body, "lost-1")

    assert proxy.sprung.is_set(), "the fault was never injected"
    assert [item.outcome for item in first.items] == ["created"] * 30
    identifiers = [item.result.task["identifier"] for item in first.items]
    assert identifiers == [f"KAN-{n}" for n in range(1, 31)]
    services.projections.catch_up()
    listed = services.tasks.list(workspace.id, limit=100).items
    assert sorted(t["identifier"] for t in listed) == sorted(identifiers)

    replayed = services.batch.create_many(principal, body, "lost-1")
    assert replayed.replayed
    assert [item.result.task["id"] for item in replayed.items] == [
        item.result.task["id"] for item in first.items
    ]
    again = services.batch.create_many(principal, body)
    assert {item.outcome for item in again.items} == {"found_settled"}
    after = services.creation.create(principal, {"title": "next"})
    assert after.task["identifier"] == "KAN-31"  # no number drawn twice
