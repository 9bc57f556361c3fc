"""From a creation manifest to its ordered steps. The order is the plan's;
compensation runs it in reverse."""

from __future__ import annotations

from typing import Any

from kandev_es.creation.steps.agent_launch import AgentLaunchStep
from kandev_es.creation.steps.agent_session import AgentSessionStep
from kandev_es.creation.steps.attachments import AttachmentClaimStep
from kandev_es.creation.steps.base import Step
from kandev_es.creation.steps.repository import RepositoryStep
from kandev_es.creation.steps.wip import WipReservationStep


def plan_step_names(manifest: dict[str, Any]) -> list[str]:
    return [step.name for step in steps_for(manifest)]


def steps_for(manifest: dict[str, Any]) -> list[Step]:
    steps: list[Step] = []
    if manifest.get("wip_limit"):
        steps.append(WipReservationStep(int(manifest["wip_limit"])))
    steps.extend(AttachmentClaimStep(sha) for sha in manifest.get("attachments", []))
    paths = manifest.get("repository_paths", {})
    steps.extend(RepositoryStep(name, paths[name]) for name in manifest.get("repositories", []))
    if manifest.get("start_agent"):
        steps.append(AgentSessionStep())
        steps.append(AgentLaunchStep())
    return steps
