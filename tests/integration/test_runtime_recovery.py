"""AC-TASKS-EXTERNAL-ID-001.8: a fenced internal Runtime resumes or aborts a
preparing creation from its durable manifest after owner loss; the stale
owner is fenced; two runtimes never both act on one tenure. Owners die for
real: a separate process SIGKILLs itself at a step boundary."""

from __future__ import annotations

import shutil
import threading
import time
import uuid

import pytest

from kandev_es.bootstrap import bootstrap
from kandev_es.creation.driver import Fenced
from kandev_es.domain.external_id import identity_id
from kandev_es.domain.identity import Identity
from tests.conftest import bearer
from tests.integration.helpers import (
    branches,
    crash_create,
    create,
    make_git_repository,
    worktrees,
)

LEASE = 1.0


@pytest.fixture
def short_lease(settings):
    services = bootstrap(settings.with_overrides(lease_seconds=LEASE))
    yield services
    services.close()


@pytest.fixture
def repo(services, workspace, tmp_path):
    path = make_git_repository(tmp_path / "backend")
    services.repositories.register(workspace.id, "backend", str(path))
    return path


def lookup(client, workspace, secret, external_id):
    return client.get(
        f"/api/v1/workspaces/{workspace.id}/tasks/by-external-id",
        query_string={"external_id": external_id},
        headers=bearer(secret),
    )


def test_runtime_completes_a_creation_whose_owner_died(
    settings, client, services, short_lease, workspace, member, repo
):
    _, secret = member
    body = {"external_id": "CR-1", "title": "t", "repositories": ["backend"]}
    crash_create(settings, secret, body, "repository:after")
    # The branch exists in the world, but the owner never recorded it.
    assert "kandev/KAN-1" in branches(repo)
    assert create(client, secret, **body).json["outcome"] == "found_unsettled"

    time.sleep(LEASE + 0.2)
    [recovery] = short_lease.runtime().recover_once()
    assert (recovery.phase, recovery.epoch) == ("completed", 1)
    settled = create(client, secret, **body)
    assert settled.json["outcome"] == "found_settled"
    assert branches(repo).count("kandev/KAN-1") == 1 and len(worktrees(repo)) == 1


def test_runtime_leaves_live_leases_alone(
    settings, client, short_lease, workspace, member, repo
):
    _, secret = member
    # A plan with an effect: one without any completes in its claim transaction.
    body = {"external_id": "CR-2", "title": "t", "repositories": ["backend"]}
    crash_create(settings, secret, body, "claim:after", lease=120)
    # An observer cannot tell slow from dead: until the lease runs out, hands off.
    assert short_lease.runtime().recover_once() == []
    assert create(client, secret, **body).json["outcome"] == "found_unsettled"


def test_stale_owner_is_fenced_and_touches_nothing(
    settings, services, short_lease, workspace, member, repo
):
    _, secret = member
    body = {"external_id": "CR-3", "title": "t", "repositories": ["backend"]}
    crash_create(settings, secret, body, "claim:after")
    key = identity_id(workspace.id, "CR-3")
    identity = services.app.load(key, Identity)
    assert identity is not None
    epoch = identity.recover(1, "runtime:test", identity.tenure(1).lease_expires_at)
    services.app.save_atomically(identity)

    with pytest.raises(Fenced):
        services.driver.drive(key, 1, epoch=0)
    assert branches(repo) == ["main"]

    done = services.driver.drive(key, 1, epoch=epoch)
    assert done.tenure.phase == "completed"
    assert "kandev/KAN-1" in branches(repo)


def test_two_runtimes_never_both_act_on_one_tenure(
    settings, services, short_lease, workspace, member, repo
):
    _, secret = member
    body = {"external_id": "CR-4", "title": "t", "repositories": ["backend"]}
    crash_create(settings, secret, body, "claim:after")
    time.sleep(LEASE + 0.2)
    second = bootstrap(settings.with_overrides(lease_seconds=LEASE))
    results: list = []
    barrier = threading.Barrier(2)

    def scan(target) -> None:
        barrier.wait(timeout=30)
        results.extend(target.runtime(owner_id=f"runtime:{uuid.uuid4()}").recover_once())

    try:
        threads = [threading.Thread(target=scan, args=(s,)) for s in (short_lease, second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        second.close()
    assert len(results) == 1
    identity = services.app.load(identity_id(workspace.id, "CR-4"), Identity)
    assert identity is not None and identity.tenure(1).epoch == 1
    assert identity.tenure(1).phase == "completed"


def test_runtime_aborts_with_compensation_when_the_manifest_cannot_finish(
    settings, client, services, short_lease, workspace, member, repo
):
    _, secret = member
    attachment = services.attachments.upload(workspace.id, "a.txt", b"payload", "text/plain")
    body = {
        "external_id": "CR-5",
        "title": "t",
        "attachments": [attachment["id"]],
        "repositories": ["backend"],
    }
    crash_create(settings, secret, body, "repository:before")
    assert services.attachments.get(workspace.id, attachment["id"]).claimed_by is not None
    shutil.rmtree(repo)  # the world changed while the owner was dead

    time.sleep(LEASE + 0.2)
    [recovery] = short_lease.runtime().recover_once()
    assert recovery.phase == "aborted"
    assert services.attachments.get(workspace.id, attachment["id"]).claimed_by is None
    assert lookup(client, workspace, secret, "CR-5").status_code == 404
