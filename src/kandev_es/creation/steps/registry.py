"""From a creation plan to its ordered steps. ``plan_step_names`` decides the
steps once, when the plan is made; they are stored in the plan (``steps`` in
the Claimed manifest) and ``steps_for`` rebuilds them from those stored names,
so a creation is driven, recovered and compensated by the steps it was
claimed with, whatever the planning rules say later. The order is the plan's;
compensation runs it in reverse.

Every manifest ever stored carries ``steps``: the field has been in the plan
since the first commit (plans claimed then stored ``[]`` and completed in the
same request, without effects)."""

from __future__ import annotations

from typing import Any

from kandev_es.creation.steps.agent_launch import AgentLaunchStep
from kandev_es.creation.steps.agent_session import AgentSessionStep
from kandev_es.creation.steps.attachments import AttachmentClaimStep
from kandev_es.creation.steps.base import Step
from kandev_es.creation.steps.repository import RepositoryStep
from kandev_es.creation.steps.wip import WipReservationStep
from kandev_es.errors import UnknownStep


def plan_step_names(manifest: dict[str, Any]) -> list[str]:
    """The steps a new plan needs, in order: decided once, then stored."""
    steps: list[Step] = []
    if manifest.get("wip_limit"):
        steps.append(WipReservationStep(int(manifest["wip_limit"])))
    steps.extend(AttachmentClaimStep(sha) for sha in manifest.get("attachments", []))
    paths = manifest.get("repository_paths", {})
    steps.extend(RepositoryStep(name, paths[name]) for name in manifest.get("repositories", []))
    if manifest.get("start_agent"):
        steps.append(AgentSessionStep())
        steps.append(AgentLaunchStep())
    return [step.name for step in steps]


def steps_for(manifest: dict[str, Any]) -> list[Step]:
    """The plan's stored steps, ready to run, reconcile or compensate."""
    return [_step(name, manifest) for name in manifest["steps"]]


def _step(name: str, manifest: dict[str, Any]) -> Step:
    kind, _, argument = name.partition(":")
    if name == WipReservationStep.name:
        return WipReservationStep(int(manifest["wip_limit"]))
    if kind == "attachment" and argument:
        return AttachmentClaimStep(argument)
    if kind == "repository" and argument in manifest.get("repository_paths", {}):
        return RepositoryStep(argument, manifest["repository_paths"][argument])
    if name == AgentSessionStep.name:
        return AgentSessionStep()
    if name == AgentLaunchStep.name:
        return AgentLaunchStep()
    raise UnknownStep(f"the plan names a step this version cannot run: {name!r}")
