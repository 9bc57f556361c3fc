"""Branches of the create protocol (AC-5, AC-7) that nothing else reaches, each
driven by a failpoint of creation/failpoints.py in a real second service (same
store, same data dir), on SQLite and PostgreSQL:

- an effect proven, then gone before Completing: the proof gate records it
  unknown and the step runs again; Completing only follows a proof;
- a step that raised with its result unknown: the driver asks the world —
  the effect is there (succeeded, completes) or not (aborted, compensated,
  ``effect_unproven``, the identity free again);
- the same, with the owner dying once the step is recorded unknown: the
  Runtime asks the world and finishes it, the effect there or made anew;
- the pre-insert re-read: a create whose lookup missed, while another creator
  completed the same identity, answers Found — from admission's re-read when
  the workspace is full, from the claim's version check when it is not.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from kandev_es.bootstrap import Services, bootstrap
from kandev_es.config import data_path
from kandev_es.creation.outcomes import Outcome
from kandev_es.domain.external_id import identity_id
from kandev_es.domain.identity import Identity
from kandev_es.domain.wip import WipLedger, wip_ledger_id
from kandev_es.errors import KandevError, http_status
from tests.integration.helpers import (
    branches,
    crash_create,
    make_git_repository,
    task_created_count,
    worktrees,
)

REPO_STEP = "repository:backend"


@pytest.fixture
def repo(services, workspace, tmp_path):
    path = make_git_repository(tmp_path / "backend")
    services.repositories.register(workspace.id, "backend", str(path))
    return path


@contextmanager
def armed(settings, failpoint: str) -> Iterator[Services]:
    """A second service on the same store with ``failpoint`` armed."""
    other = bootstrap(settings.with_overrides(failpoint=failpoint, lease_seconds=120))
    try:
        yield other
    finally:
        release_pause(other, failpoint.split("@")[0])
        other.close()


def release_pause(services: Services, boundary: str) -> None:
    markers = data_path(services.settings, "failpoints")
    markers.mkdir(parents=True, exist_ok=True)
    (markers / (boundary.replace(":", "_") + ".continue")).touch()


def wait_for_pause(services: Services, boundary: str) -> None:
    waiting = data_path(services.settings, "failpoints", boundary.replace(":", "_") + ".waiting")
    deadline = time.monotonic() + 30
    while not waiting.exists():
        assert time.monotonic() < deadline, f"the owner never reached {boundary}"
        time.sleep(0.02)


def in_background(work: Callable[[], Any]) -> Callable[[], Any]:
    """Start ``work`` in a thread; the returned call joins it and gives its
    result (or raises what it raised)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = work()
        except BaseException as error:  # handed to the test thread
            box["error"] = error

    thread = threading.Thread(target=run)
    thread.start()

    def join() -> Any:
        thread.join(timeout=60)
        assert not thread.is_alive(), "the create never finished"
        if "error" in box:
            raise box["error"]
        return box["result"]

    return join


def history(services: Services, workspace, external_id: str) -> list[Any]:
    identity = identity_id(workspace.id, external_id)
    return list(services.app.repository.event_store.get(identity))


def repository_steps(events: list[Any]) -> list[tuple[str, Any]]:
    return [
        (event.status, event.evidence)
        for event in events
        if type(event).__name__ == "StepRecorded" and event.step == REPO_STEP
    ]


def git(repo, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_an_effect_gone_before_completing_is_made_again_before_completing(
    settings, services, workspace, member, repo
):
    _, secret = member
    body = {"external_id": "PM-1", "title": "t", "repositories": ["backend"]}
    with armed(settings, "repository:after@wait") as owner:
        join = in_background(lambda: owner.creation.create(owner.tokens.authenticate(secret), body))
        wait_for_pause(owner, "repository:after")
        # The branch and worktree exist, not yet recorded; someone removes them.
        [worktree] = worktrees(repo)
        git(repo, "worktree", "remove", "--force", worktree)
        git(repo, "branch", "-D", "kandev/KAN-1")
        release_pause(owner, "repository:after")
        result = join()

    assert result.outcome == Outcome.CREATED
    events = history(services, workspace, "PM-1")
    statuses = [status for status, _ in repository_steps(events)]
    assert statuses == ["started", "succeeded", "unknown", "started", "succeeded"]
    assert repository_steps(events)[2][1] == {"proof": "missing"}
    kinds = [type(event).__name__ for event in events]
    last_step = max(i for i, kind in enumerate(kinds) if kind == "StepRecorded")
    assert kinds.index("Completing") > last_step and kinds[-1] == "Completed"
    assert branches(repo) == ["kandev/KAN-1", "main"] and len(worktrees(repo)) == 1


def test_a_step_that_raised_after_its_effect_is_reconciled_and_completes(
    settings, services, workspace, member, repo
):
    _, secret = member
    with armed(settings, "repository:after@raise") as owner:
        result = owner.creation.create(
            owner.tokens.authenticate(secret),
            {"external_id": "UK-1", "title": "t", "repositories": ["backend"]},
        )

    assert result.outcome == Outcome.CREATED
    steps = repository_steps(history(services, workspace, "UK-1"))
    assert [status for status, _ in steps] == ["started", "unknown", "succeeded"]
    assert "FailpointRaised" in steps[1][1]["error"]
    assert steps[2][1]["branch"] == "kandev/KAN-1"  # the evidence the world gave
    assert branches(repo) == ["kandev/KAN-1", "main"] and len(worktrees(repo)) == 1
    found = services.creation.lookup(workspace.id, "UK-1")
    assert found is not None and found.outcome == Outcome.FOUND_SETTLED


def test_a_step_that_raised_before_its_effect_aborts_unproven_and_frees_the_identity(
    settings, services, workspace, member, repo
):
    principal, secret = member
    body = {"external_id": "UK-2", "title": "t", "repositories": ["backend"]}
    with armed(settings, "repository:before@raise") as owner, pytest.raises(KandevError) as raised:
        owner.creation.create(owner.tokens.authenticate(secret), body)

    assert (http_status(raised.value), raised.value.code) == (502, "effect_unproven")
    events = history(services, workspace, "UK-2")
    assert [status for status, _ in repository_steps(events)] == [
        "started",
        "unknown",
        "failed",
        "compensated",
    ]
    assert type(events[-1]).__name__ == "Aborted"
    assert branches(repo) == ["main"] and worktrees(repo) == []
    assert services.creation.lookup(workspace.id, "UK-2") is None
    # Free again: the next create of the same identity makes the task.
    again = services.creation.create(principal, body)
    assert again.outcome == Outcome.CREATED and again.task["identifier"] == "KAN-2"


@pytest.mark.parametrize(("side", "made"), [("after", True), ("before", False)])
def test_the_runtime_settles_a_step_its_dead_owner_left_unknown(
    settings, services, workspace, member, repo, side, made
):
    """The owner's step raised (after / before its effect), was recorded
    unknown, and the owner died before asking the world. Once the lease runs
    out the Runtime reconciles: the effect is there (succeeded) or it runs the
    step again; either way one branch, one worktree, Completed."""
    _, secret = member
    body = {"external_id": f"RU-{side}", "title": "t", "repositories": ["backend"]}
    crash_create(settings, secret, body, f"repository:{side}@raise,repository:unknown")
    assert [
        status for status, _ in repository_steps(history(services, workspace, body["external_id"]))
    ] == ["started", "unknown"]
    assert ("kandev/KAN-1" in branches(repo)) is made

    recovered: list[Any] = []
    deadline = time.monotonic() + 30
    while not recovered:  # the lease (1 s) must run out first
        assert time.monotonic() < deadline, "the runtime never took the creation over"
        recovered = services.runtime().recover_once()
        time.sleep(0.1)

    assert [r.phase for r in recovered] == ["completed"]
    statuses = [
        status for status, _ in repository_steps(history(services, workspace, body["external_id"]))
    ]
    again = ["started", "succeeded"] if not made else ["succeeded"]
    assert statuses == ["started", "unknown", *again]
    assert branches(repo) == ["kandev/KAN-1", "main"] and len(worktrees(repo)) == 1
    found = services.creation.lookup(workspace.id, body["external_id"])
    assert found is not None and found.outcome == Outcome.FOUND_SETTLED


def test_a_full_workspace_answers_found_when_the_identity_was_completed_after_the_lookup(
    settings, services, workspace, member
):
    """Admission's re-read: the lookup missed, then another creator took the
    last WIP slot with this very identity; the refusal re-reads and answers
    Found instead of ``capacity_exhausted``."""
    principal, secret = member
    services.workspaces.set_wip_limit(workspace.id, 1)
    body = {"external_id": "RR-1", "title": "t"}
    with armed(settings, "lookup:after@wait") as late:
        join = in_background(lambda: late.creation.create(late.tokens.authenticate(secret), body))
        wait_for_pause(late, "lookup:after")
        first = services.creation.create(principal, body)
        assert first.outcome == Outcome.CREATED
        release_pause(late, "lookup:after")
        answer = join()

    assert answer.outcome == Outcome.FOUND_SETTLED
    assert answer.task["id"] == first.task["id"]
    ledger = services.app.load(wip_ledger_id(workspace.id), WipLedger)
    assert ledger is not None and ledger.reserved == [str(first.task["id"])]
    assert task_created_count(services) == 1


def test_a_create_whose_lookup_missed_is_found_by_the_claims_version_check(
    settings, services, workspace, member
):
    """No effects, no limit: the claim itself is the pre-insert check — its
    save loses the version check, the identity is read again, Found."""
    principal, secret = member
    body = {"external_id": "RR-2", "title": "t"}
    with armed(settings, "lookup:after@wait") as late:
        join = in_background(lambda: late.creation.create(late.tokens.authenticate(secret), body))
        wait_for_pause(late, "lookup:after")
        first = services.creation.create(principal, body)
        release_pause(late, "lookup:after")
        answer = join()

    assert first.outcome == Outcome.CREATED
    assert answer.outcome == Outcome.FOUND_SETTLED and answer.task["id"] == first.task["id"]
    assert task_created_count(services) == 1
    identity = services.app.load(identity_id(workspace.id, "RR-2"), Identity)
    assert identity is not None and len(identity.tenures) == 1
