"""The driver acts on the steps stored in the plan (the Claimed manifest), not on
steps recomputed from the plan's other fields: a creation finishes with the steps
it was claimed with. Real git repositories; both backends."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kandev_es.bootstrap import Services
from kandev_es.domain import creation
from kandev_es.domain.external_id import identity_id
from kandev_es.domain.identity import COMPLETED, PREPARING, Identity
from kandev_es.domain.plan import CreationPlan
from kandev_es.domain.task import TASK_ACTIVE, Task
from kandev_es.errors import UnknownStep
from tests.integration.helpers import branches, make_git_repository


def claim_by_hand(services: Services, workspace: Any, steps: list[str], path: str) -> Identity:
    """A claim as another version might have saved it: a plan for the repository
    ``backend`` whose stored steps are ``steps``."""
    plan = CreationPlan(
        workspace_id=workspace.id,
        external_id="ST-1",
        identifier=f"{workspace.task_prefix}-7",
        title="stored steps",
        description="",
        workflow="default",
        workflow_step="backlog",
        repositories=["backend"],
        repository_paths={"backend": path},
        steps=steps,
    )
    identity = Identity.register(identity_id(workspace.id, "ST-1"), workspace.id, "ST-1")
    _, task = creation.claim(
        identity,
        plan,
        task_id=uuid.uuid4(),
        owner_id="another-version",
        actor="token:test",
        lease_expires_at=datetime.now(UTC) + timedelta(minutes=5),
        handle_hash="",
    )
    services.app.save_atomically(identity, task)
    return identity


def test_a_plan_stored_without_the_repository_step_completes_without_a_branch(
    services, workspace, tmp_path
):
    repo = make_git_repository(tmp_path / "backend")
    identity = claim_by_hand(services, workspace, steps=[], path=str(repo))
    done = services.driver.drive(identity.id, 1, epoch=0)
    assert done.tenure.phase == COMPLETED
    assert done.tenure.steps == {}
    assert done.task.phase == TASK_ACTIVE
    assert branches(repo) == ["main"]  # the recomputed plan would have made kandev/KAN-7


def test_a_plan_stored_with_the_repository_step_makes_the_branch(services, workspace, tmp_path):
    repo = make_git_repository(tmp_path / "backend")
    identity = claim_by_hand(services, workspace, steps=["repository:backend"], path=str(repo))
    done = services.driver.drive(identity.id, 1, epoch=0)
    assert done.tenure.phase == COMPLETED
    assert list(done.tenure.steps) == ["repository:backend"]
    assert branches(repo) == ["kandev/KAN-7", "main"]


@pytest.mark.parametrize("step", ["policy:quota", "repository:frontend"])
def test_a_stored_step_this_version_cannot_build_changes_nothing(
    services, workspace, tmp_path, step
):
    repo = make_git_repository(tmp_path / "backend")
    identity = claim_by_hand(services, workspace, steps=[step], path=str(repo))
    with pytest.raises(UnknownStep):
        services.driver.drive(identity.id, 1, epoch=0)
    after = services.app.load(identity.id, Identity)
    assert after is not None and after.version == identity.version
    assert after.tenure(1).phase == PREPARING
    task = services.app.load(after.tenure(1).task_id, Task)
    assert task is not None and task.version == 1
    assert branches(repo) == ["main"]
