"""``Tasks.retry_on_conflict``: the one optimistic-concurrency loop (token
revocation, task edits, repositories, policy, workspace deletion and the
creation steps' shared records all use it). A rival writer is a real second
save to the same stream, between our read and our save."""

from __future__ import annotations

import pytest

from kandev_es.application import CONFLICT_ATTEMPTS
from kandev_es.domain.workspace import Workspace
from kandev_es.errors import Contended, WorkspaceNotFound, http_status


def rival_sets_limit(services, workspace_id, limit: int) -> None:
    rival = services.app.load(workspace_id, Workspace)
    rival.set_wip_limit(limit)
    services.app.save_atomically(rival)


def test_a_conflict_reads_again_and_the_second_attempt_saves(services, workspace):
    app = services.app
    reads: list[int] = []

    def load() -> Workspace:
        ours = app.load(workspace.id, Workspace)
        reads.append(ours.version)
        if len(reads) == 1:  # someone else writes between our read and our save
            rival_sets_limit(services, workspace.id, 5)
        return ours

    def register(ours: Workspace) -> str:
        ours.register_repository("backend", "/srv/backend")
        return "registered"

    assert app.retry_on_conflict(load, register) == "registered"
    assert len(reads) == 2 and reads[1] == reads[0] + 1  # the rival's write, read again
    stored = app.load(workspace.id, Workspace)
    assert stored.wip_limit == 5 and stored.repositories == {"backend": "/srv/backend"}


def test_exhausted_attempts_raise_contended_and_save_nothing_of_ours(services, workspace):
    app = services.app
    attempts: list[int] = []

    def load() -> Workspace:
        ours = app.load(workspace.id, Workspace)
        attempts.append(ours.version)
        rival_sets_limit(services, workspace.id, len(attempts))  # every time
        return ours

    def register(ours: Workspace) -> None:
        ours.register_repository("backend", "/srv/backend")

    with pytest.raises(Contended) as raised:
        app.retry_on_conflict(load, register, contended="workspace is contended; retry")
    assert len(attempts) == CONFLICT_ATTEMPTS
    assert http_status(raised.value) == 409 and raised.value.code == "conflict"
    assert raised.value.message == "workspace is contended; retry"
    stored = app.load(workspace.id, Workspace)
    assert stored.repositories == {} and stored.wip_limit == CONFLICT_ATTEMPTS


def test_nothing_pending_writes_nothing_and_a_refusal_stops_at_once(services, workspace):
    app = services.app
    before = app.max_notification_id()
    same = app.retry_on_conflict(
        lambda: app.load(workspace.id, Workspace), lambda ours: ours.set_wip_limit(None)
    )
    assert same is None and app.max_notification_id() == before

    calls: list[None] = []

    def refuse(ours: Workspace) -> None:
        calls.append(None)
        ours.set_wip_limit(3)  # applied in memory, then refused: never saved
        raise WorkspaceNotFound("workspace not found")

    with pytest.raises(WorkspaceNotFound):
        app.retry_on_conflict(lambda: app.load(workspace.id, Workspace), refuse)
    assert len(calls) == 1 and app.max_notification_id() == before


def test_revoking_a_run_credential_twice_revokes_once(services, workspace):
    tokens = services.tokens
    tokens.issue(workspace_id=workspace.id, admin=False, run_id="run-1", task_id=None)
    assert tokens.revoke_run("run-1", "agent_exited") is True
    before = services.app.max_notification_id()
    assert tokens.revoke_run("run-1", "agent_exited") is False
    assert tokens.revoke_run("no-such-run", "agent_exited") is False
    assert services.app.max_notification_id() == before
