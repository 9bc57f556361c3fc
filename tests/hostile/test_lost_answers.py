"""A save that committed but whose answer was lost is never retried blind.

A real TCP proxy (tests/support/pg_proxy.py) sits between the service and the
real PostgreSQL: it lets a save's statement through, the server commits it,
and the proxy drops the connection before the answer (ReadyForQuery) reaches
the service. The recorder then asks the store whether those events are there
before retrying: a create answers ``created`` with its creation handle, one
task, one office number; a patch is applied once; a release is not answered
as its own replay. PostgreSQL only: an embedded SQLite has no connection to
lose."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from kandev_es.bootstrap import Services, bootstrap
from kandev_es.domain.task import Task
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


def tasks_in(services: Services, workspace_id) -> list[dict]:
    services.projections.catch_up()
    return services.tasks.list(workspace_id).items


@pytest.mark.parametrize("external_id", [None, "LOST-1"], ids=["anonymous", "external_id"])
def test_a_claim_committed_with_its_answer_lost_answers_created_once(proxied, external_id):
    services, proxy = proxied
    workspace = services.workspaces.open("lost")
    _, principal = services.tokens.issue(workspace_id=workspace.id, admin=False)
    body = {"title": "t"} | ({"external_id": external_id} if external_id else {})

    proxy.lose_answer(CLAIM)
    created = services.creation.create(principal, body)

    assert proxy.sprung.is_set(), "the fault was never injected"
    assert created.outcome.value == "created"
    assert created.handle
    assert created.task["identifier"] == "KAN-1"
    assert [t["identifier"] for t in tasks_in(services, workspace.id)] == ["KAN-1"]
    after = services.creation.create(principal, {"title": "next"})
    assert after.task["identifier"] == "KAN-2"  # the number was not drawn twice


def test_a_conditional_patch_committed_with_its_answer_lost_is_answered_as_applied(proxied):
    services, proxy = proxied
    workspace = services.workspaces.open("lost")
    _, principal = services.tokens.issue(workspace_id=workspace.id, admin=False)
    created = services.creation.create(principal, {"title": "t"})
    task_id = uuid.UUID(created.task["id"])
    revision = created.task["revision"]

    proxy.lose_answer(b"Task.Updated")
    # If-Match on the revision read: a blind retry would find its own edit
    # and refuse the caller's edit as a stale one.
    patched = services.tasks.patch(principal, task_id, {"title": "renamed"}, revision)

    assert proxy.sprung.is_set(), "the fault was never injected"
    assert patched["title"] == "renamed" and patched["revision"] == revision + 1
    assert services.app.load(task_id, Task).revision == revision + 1


def test_a_release_committed_with_its_answer_lost_is_answered_as_released_not_replayed(proxied):
    services, proxy = proxied
    workspace = services.workspaces.open("lost")
    _, principal = services.tokens.issue(workspace_id=workspace.id, admin=False)
    services.creation.create(principal, {"title": "t", "external_id": "LOST-2"})

    proxy.lose_answer(b"Identity.Released")
    released = services.release.release(workspace.id, "LOST-2", "op-1", actor="cli")

    assert proxy.sprung.is_set(), "the fault was never injected"
    assert released.released and not released.replayed


def test_a_token_issue_committed_with_its_answer_lost_hands_out_a_working_token(proxied):
    services, proxy = proxied
    workspace = services.workspaces.open("lost")

    proxy.lose_answer(b"ApiToken.Issued")
    secret, principal = services.tokens.issue(workspace_id=workspace.id, admin=False)

    assert proxy.sprung.is_set(), "the fault was never injected"
    created = services.creation.create(principal, {"title": "t"})
    assert created.outcome.value == "created"
    assert services.tokens.authenticate(secret) == principal
