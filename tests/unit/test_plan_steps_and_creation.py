"""A plan's steps are decided once and stored; ``steps_for`` rebuilds exactly
the stored ones. The domain decides admission, builds a claim's Identity tenure
and Task from the plan alone, and completes them, without I/O."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kandev_es.creation.steps.agent_launch import AgentLaunchStep
from kandev_es.creation.steps.agent_session import AgentSessionStep
from kandev_es.creation.steps.attachments import AttachmentClaimStep
from kandev_es.creation.steps.registry import plan_step_names, steps_for
from kandev_es.creation.steps.repository import RepositoryStep
from kandev_es.creation.steps.wip import WipReservationStep
from kandev_es.domain import creation
from kandev_es.domain.errors import DomainRuleBroken
from kandev_es.domain.identity import (
    COMPLETED,
    OUTCOME_CREATED,
    OUTCOME_CREATED_IDENTITY_LOST,
    PREPARING,
    Identity,
)
from kandev_es.domain.plan import CreationPlan
from kandev_es.domain.task import TASK_ACTIVE, TASK_PREPARING
from kandev_es.domain.wip import WipLedger
from kandev_es.domain.workspace import Workspace
from kandev_es.errors import CapacityExceeded, TaskNotCreated, UnknownStep

WORKSPACE = uuid.UUID("0b5e2f0a-1c2d-4e5f-8a9b-0c1d2e3f4a5b")
SHA = "ab" * 32


def make_plan(**overrides: Any) -> CreationPlan:
    fields: dict[str, Any] = {
        "workspace_id": WORKSPACE,
        "external_id": "JIRA-1",
        "identifier": "KAN-7",
        "title": "Fix login",
        "description": "the button",
        "workflow": "default",
        "workflow_step": "backlog",
        "repositories": ["app", "lib"],
        "attachments": [SHA],
        "start_agent": True,
        "agent_profile": "default",
        "parent_id": uuid.UUID("3f0c0a7e-0000-4000-8000-000000000002"),
        "repository_paths": {"app": "/srv/app", "lib": "/srv/lib"},
        "wip_limit": 3,
    }
    fields.update(overrides)
    plan = CreationPlan(**fields)
    if "steps" not in overrides:
        plan = CreationPlan(**{**fields, "steps": plan_step_names(plan.to_manifest())})
    return plan


# ----- the registry ----------------------------------------------------------------------
def test_a_full_plan_names_every_step_in_order() -> None:
    assert make_plan().steps == [
        "policy:wip",
        f"attachment:{SHA}",
        "repository:app",
        "repository:lib",
        "agent_session",
        "agent_launch",
    ]


def test_stored_steps_rebuild_to_the_same_names_and_arguments() -> None:
    steps = steps_for(make_plan().to_manifest())
    assert [step.name for step in steps] == make_plan().steps
    wip, attachment, app, lib, session, launch = steps
    assert isinstance(wip, WipReservationStep) and wip.limit == 3
    assert isinstance(attachment, AttachmentClaimStep) and attachment.sha256 == SHA
    assert isinstance(app, RepositoryStep) and (app.repository, app.path) == ("app", "/srv/app")
    assert isinstance(lib, RepositoryStep) and lib.path == "/srv/lib"
    assert isinstance(session, AgentSessionStep)
    assert isinstance(launch, AgentLaunchStep)


def test_a_plan_without_effects_has_no_steps() -> None:
    plan = make_plan(repositories=[], attachments=[], start_agent=False, wip_limit=None)
    assert plan.steps == []
    assert steps_for(plan.to_manifest()) == []


def test_the_stored_steps_win_over_what_the_fields_would_plan() -> None:
    # Fields that would plan six steps, stored with two: the two are driven.
    plan = make_plan(steps=["repository:lib", "agent_session"])
    assert [step.name for step in steps_for(plan.to_manifest())] == [
        "repository:lib",
        "agent_session",
    ]
    assert steps_for(make_plan(steps=[]).to_manifest()) == []


@pytest.mark.parametrize(
    "name", ["policy:quota", "repository:unplanned", "attachment:", "agent_teleport"]
)
def test_a_stored_step_this_version_cannot_build_is_refused(name: str) -> None:
    with pytest.raises(UnknownStep):
        steps_for(make_plan(steps=[name]).to_manifest())


# ----- the domain: claim and complete from a plan ----------------------------------------
def claim(identity: Identity, plan: CreationPlan) -> tuple[int, Any]:
    return creation.claim(
        identity,
        plan,
        task_id=uuid.uuid4(),
        owner_id="owner",
        actor="token:abc",
        lease_expires_at=datetime.now(UTC) + timedelta(seconds=30),
        handle_hash="hh",
    )


def test_a_claim_builds_the_tenure_and_the_task_from_the_plan() -> None:
    plan = make_plan()
    identity = Identity.register(uuid.uuid4(), WORKSPACE, plan.external_id)
    number, task = claim(identity, plan)
    tenure = identity.tenure(number)
    assert (number, tenure.phase, tenure.task_id) == (1, PREPARING, task.id)
    assert tenure.plan == plan.to_manifest()
    assert (tenure.plan_hash, tenure.handle_hash) == (plan.plan_hash, "hh")
    assert tenure.actor == "token:abc"
    assert task.phase == TASK_PREPARING
    assert task.identity_id == identity.id
    assert task.created_by == "token:abc"
    for name in (
        "workspace_id", "identifier", "external_id", "title", "description", "workflow",
        "workflow_step", "parent_id", "repositories", "attachments", "start_agent",
        "agent_profile",
    ):
        assert getattr(task, name) == getattr(plan, name), name


def test_a_claim_on_a_held_identity_is_refused() -> None:
    plan = make_plan()
    identity = Identity.register(uuid.uuid4(), WORKSPACE, plan.external_id)
    claim(identity, plan)
    with pytest.raises(DomainRuleBroken):
        claim(identity, plan)


def test_a_plan_without_steps_completes_at_once() -> None:
    plan = make_plan(steps=[])
    identity = Identity.register(uuid.uuid4(), WORKSPACE, plan.external_id)
    number, task = claim(identity, plan)
    assert creation.complete_without_effects(identity, task, number) == OUTCOME_CREATED
    assert identity.tenure(number).phase == COMPLETED
    assert (task.phase, task.external_id) == (TASK_ACTIVE, "JIRA-1")


def test_a_plan_with_steps_cannot_skip_their_proof() -> None:
    plan = make_plan()
    identity = Identity.register(uuid.uuid4(), WORKSPACE, plan.external_id)
    number, task = claim(identity, plan)
    with pytest.raises(DomainRuleBroken):
        creation.complete_without_effects(identity, task, number)
    assert identity.tenure(number).phase == PREPARING
    assert task.phase == TASK_PREPARING


def test_a_tenure_released_while_preparing_completes_without_its_external_id() -> None:
    plan = make_plan()
    identity = Identity.register(uuid.uuid4(), WORKSPACE, plan.external_id)
    number, task = claim(identity, plan)
    identity.release(number, "op-1", "operator", actor="token:op")
    identity.begin_completing(number)
    assert creation.complete(identity, task, number) == OUTCOME_CREATED_IDENTITY_LOST
    assert (task.phase, task.external_id) == (TASK_ACTIVE, None)


# ----- the domain: admission -------------------------------------------------------------
def test_a_live_workspace_without_a_limit_admits() -> None:
    assert creation.admission_refusal(Workspace.open("acme"), None) is None


def test_a_missing_or_deleted_workspace_refuses_as_task_not_created() -> None:
    deleted = Workspace.open("acme")
    deleted.delete()
    for workspace in (None, deleted):
        refusal = creation.admission_refusal(workspace, None)
        assert isinstance(refusal, TaskNotCreated)


def test_a_full_wip_ledger_refuses_with_the_limit() -> None:
    workspace = Workspace.open("acme")
    workspace.set_wip_limit(1)
    ledger = WipLedger.open(workspace.id)
    assert creation.admission_refusal(workspace, ledger) is None
    assert creation.admission_refusal(workspace, None) is None  # no ledger yet: none in use
    ledger.reserve(uuid.uuid4(), 1)
    refusal = creation.admission_refusal(workspace, ledger)
    assert isinstance(refusal, CapacityExceeded)
    assert (refusal.code, refusal.details) == ("capacity_exhausted", {"wip_limit": 1})


def test_the_manifest_is_every_field_in_order_and_its_hash_the_canonical_json_one() -> None:
    plan = make_plan(started_by_run=None)
    expected = {name: getattr(plan, name) for name in plan.__dataclass_fields__}
    del expected["started_by_run"]  # left out when None
    expected.update(workspace_id=str(WORKSPACE), parent_id=str(plan.parent_id))
    assert list(plan.to_manifest().items()) == list(expected.items())
    assert plan.to_manifest()["repositories"] is not plan.repositories  # copies
    canonical = json.dumps(expected, sort_keys=True, separators=(",", ":"))
    assert plan.plan_hash == hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    assert make_plan(started_by_run="run-1").to_manifest()["started_by_run"] == "run-1"
