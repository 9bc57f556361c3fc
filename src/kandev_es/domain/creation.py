"""A creation in terms of the aggregates: whether a claim is admitted, and what
a claim and a completion change, from the plan alone. No I/O: the caller loads
and saves; both aggregates of a claim (and of a completion) go in one save."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from kandev_es.domain.errors import DomainRuleBroken
from kandev_es.domain.identity import OUTCOME_CREATED_IDENTITY_LOST, Identity
from kandev_es.domain.plan import CreationPlan
from kandev_es.domain.task import Task
from kandev_es.domain.wip import WipLedger
from kandev_es.domain.workspace import Workspace
from kandev_es.errors import CapacityExceeded, KandevError, TaskNotCreated


def admission_refusal(workspace: Workspace | None, ledger: WipLedger | None) -> KandevError | None:
    """Why a new claim may not be admitted into the workspace as read now, or
    None: it must still accept creates and, under a WIP limit, have a slot."""
    if workspace is None or workspace.deleted:
        return TaskNotCreated()
    if workspace.wip_limit is not None:
        in_use = len(ledger.reserved) if ledger is not None else 0
        if in_use >= workspace.wip_limit:
            return CapacityExceeded(
                f"workspace WIP limit {workspace.wip_limit} reached",
                wip_limit=workspace.wip_limit,
            )
    return None


def claim(
    identity: Identity,
    plan: CreationPlan,
    *,
    task_id: uuid.UUID,
    owner_id: str,
    actor: str,
    lease_expires_at: datetime,
    handle_hash: str,
    completed: bool = False,
    request_id: str | None = None,
    traceparent: str | None = None,
) -> tuple[int, Task]:
    """A new tenure of ``identity`` for the plan, and the preparing Task it
    creates; returns the tenure's number and the task (both unsaved).

    ``completed``: a plan without steps has nothing to prepare, prove or
    recover, so its tenure is claimed and Completed at once (no Completing
    between) and its task is born active (``Task.CreatedActive``, no Activated
    after it): the claim and its completion are one save of four events, not
    six. The tenure's outcome is then ``identity.tenure(number).outcome``."""
    if completed and plan.steps:
        raise DomainRuleBroken("a plan with steps completes only once they are proven")
    number = identity.claim(
        task_id=task_id,
        owner_id=owner_id,
        actor=actor,
        plan=plan.to_manifest(),
        plan_hash=plan.plan_hash,
        lease_expires_at=lease_expires_at,
        handle_hash=handle_hash,
        request_id=request_id,
        traceparent=traceparent,
    ).number
    if completed:
        identity.complete(number)
    return number, Task.create(task_id, active=completed, **_task_fields(identity, plan, actor))


def _task_fields(identity: Identity, plan: CreationPlan, actor: str) -> dict[str, Any]:
    return {
        "workspace_id": plan.workspace_id,
        "identity_id": identity.id,
        "identifier": plan.identifier,
        "external_id": plan.external_id,
        "title": plan.title,
        "description": plan.description,
        "workflow": plan.workflow,
        "workflow_step": plan.workflow_step,
        "parent_id": plan.parent_id,
        "repositories": plan.repositories,
        "attachments": plan.attachments,
        "start_agent": plan.start_agent,
        "agent_profile": plan.agent_profile,
        "created_by": actor,
    }


def complete(identity: Identity, task: Task, number: int) -> str:
    """A completing tenure becomes Completed and its task active. A tenure
    released while it prepared completes as identity-lost: its task keeps no
    external ID. Returns the tenure's outcome."""
    outcome = identity.complete(number)
    task.activate(drop_external_id=outcome == OUTCOME_CREATED_IDENTITY_LOST)
    return outcome


def complete_without_effects(identity: Identity, task: Task, number: int) -> str:
    """A claimed plan with no steps has nothing to prepare or prove: Completed
    at once, without Completing (``claim(..., completed=True)`` does the claim too)."""
    if identity.tenure(number).plan["steps"]:
        raise DomainRuleBroken("a plan with steps completes only once they are proven")
    return complete(identity, task, number)
