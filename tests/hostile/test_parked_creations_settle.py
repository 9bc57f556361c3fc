"""Operators can settle every creation. A create with a repository whose
owner died right after the repository step (a real process SIGKILLed there),
and whose worktree's ``.git`` was then pointed elsewhere, can be neither
proven nor compensated: the Runtime takes it over as often as it may and
parks it (aborting). An operator lists it with its reason and evidence (REST
and CLI), and either repairs the worktree and retries it -- a fresh series of
takeovers, which compensates it -- or aborts it, removing the worktree and
branch forcibly. Either way it ends settled (Aborted) with nothing left in the
world, the identity free again, each call idempotent by its operation id and
recorded in the identity's history. Real git, the real Runtime, both backends."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kandev_es.bootstrap import bootstrap
from kandev_es.config import data_path
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
ATTEMPTS = 2


@pytest.fixture
def parked(settings, services, workspace, member, tmp_path):
    """A creation parked in aborting, its worktree's .git pointed elsewhere;
    yields its identity id, the repository, the worktree and its true .git."""
    repository = make_git_repository(tmp_path / "backend")
    services.repositories.register(workspace.id, "backend", str(repository))
    body = {"external_id": "PARK-1", "title": "t", "repositories": ["backend"]}
    crash_create(settings, member[1], body, "repository:after")
    key = identity_id(workspace.id, "PARK-1")
    task_id = services.app.load(key, Identity).tenure(1).task_id
    worktree = data_path(settings, "worktrees", str(task_id), "backend")
    true_git = (worktree / ".git").read_text()
    (worktree / ".git").write_text("gitdir: /nonexistent\n")
    runtime_services = bootstrap(
        settings.with_overrides(
            lease_seconds=LEASE, recovery_backoff_seconds=0, recovery_attempts=ATTEMPTS
        )
    )
    runtime = runtime_services.runtime()
    for _ in range(ATTEMPTS):
        time.sleep(LEASE + 0.2)
        assert runtime.recover_once() == []  # each takeover fails
    time.sleep(LEASE + 0.2)  # parked: nobody holds its lease any more
    yield key, repository, worktree, true_git, runtime
    runtime_services.close()


def nothing_left(repository: Path, worktree: Path) -> None:
    assert branches(repository) == ["main"]
    assert worktrees(repository) == []  # only the main one
    assert not worktree.exists()
    assert "kandevtask" not in (repository / ".git" / "config").read_text()


def settle(client, workspace, key, action, secret, operation_id):
    return client.post(
        f"/api/v1/workspaces/{workspace.id}/creations/{key}/{action}",
        headers={**bearer(secret), "Idempotency-Key": operation_id},
    )


def history_events(services, key) -> list[str]:
    return [n.topic.rsplit(".", 1)[-1] for n in services.app.recorder.select_notifications(
        start=1, limit=1_000_000
    ) if n.originator_id == key]


def test_a_parked_creation_is_listed_with_its_reason_and_evidence(
    client, workspace, operator, member, parked, cli
):
    key, *_ = parked
    listed = client.get(
        f"/api/v1/workspaces/{workspace.id}/creations/parked", headers=bearer(operator[1])
    )
    assert listed.status_code == 200, listed.json
    [entry] = listed.json["items"]
    assert (entry["identity_id"], entry["phase"], entry["takeovers"]) == (
        str(key), "aborting", ATTEMPTS
    )
    assert entry["external_id"] == "PARK-1"
    assert "worktree remove" in entry["reason"]  # why its compensation failed
    [step] = entry["steps"]  # made, never recorded: the owner died
    assert (step["name"], step["status"]) == ("repository:backend", "started")
    members = client.get(
        f"/api/v1/workspaces/{workspace.id}/creations/parked", headers=bearer(member[1])
    )
    assert members.status_code == 403
    out = cli("creations", "parked", "--workspace", str(workspace.id))
    assert out.exit_code == 0 and str(key) in out.output and "1 parked" in out.output


def test_retry_after_repair_settles_the_parked_creation_with_nothing_left(
    client, services, workspace, operator, member, parked
):
    key, repository, worktree, true_git, runtime = parked
    refused = settle(client, workspace, key, "retry", operator[1], "")
    assert refused.status_code == 400  # the operation id is required
    (worktree / ".git").write_text(true_git)  # the operator's repair

    first = settle(client, workspace, key, "retry", operator[1], "fix-1")
    again = settle(client, workspace, key, "retry", operator[1], "fix-1")
    assert first.status_code == again.status_code == 200, first.json
    assert first.headers["Idempotent-Replayed"] == "false"
    assert again.headers["Idempotent-Replayed"] == "true"
    assert first.json["takeovers"] == 0
    [recovered] = runtime.recover_once()  # the fresh series' first takeover
    assert (recovered.identity_id, recovered.phase) == (key, "aborted")

    nothing_left(repository, worktree)
    assert history_events(services, key).count("RecoveryRenewed") == 1
    [renewed] = [e for e in services.app.events.get(key) if type(e).__name__ == "RecoveryRenewed"]
    assert renewed.request_id == first.headers["X-Request-Id"]  # which request retried it
    redo = create(client, member[1], external_id="PARK-1", title="t", repositories=["backend"])
    assert redo.json["outcome"] == "created"  # the identity was free
    wrong = settle(client, workspace, key, "abort", operator[1], "fix-1")
    assert wrong.status_code == 422  # the same operation id for another action


def test_abort_removes_what_the_parked_creation_made_and_frees_the_identity(
    client, services, workspace, operator, member, parked, cli
):
    key, repository, worktree, _, runtime = parked
    out = cli(
        "creations", "abort", str(key), "--workspace", str(workspace.id),
        "--operation-id", "abort-1",
    )
    assert out.exit_code == 0, out.output
    assert '"phase": "aborted"' in out.output and '"replayed": false' in out.output
    again = settle(client, workspace, key, "abort", operator[1], "abort-1")
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    [step] = again.json["steps"]
    assert step["status"] == "compensated"
    assert step["evidence"]["forced"] is True and step["evidence"]["by"] == "operator"

    nothing_left(repository, worktree)
    events = history_events(services, key)
    assert events.count("AbortForced") == 1 and events[-1] == "Aborted"
    assert runtime.recover_once() == [] and services.parked().list() == []
    redo = create(client, member[1], external_id="PARK-1", title="t", repositories=["backend"])
    assert redo.json["outcome"] == "created"
