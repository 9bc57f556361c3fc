"""Task representations (the DTO every adapter returns). ``external_id`` is
omitted, not null, on a task that holds none."""

from __future__ import annotations

from typing import Any

from kandev_es.domain.task import Task


def task_dto(task: Task) -> dict[str, Any]:
    dto: dict[str, Any] = {
        "id": str(task.id),
        "workspace_id": str(task.workspace_id),
        "identifier": task.identifier,
        "title": task.title,
        "description": task.description,
        "workflow": task.workflow,
        "workflow_step": task.workflow_step,
        "parent_id": str(task.parent_id) if task.parent_id else None,
        "repositories": list(task.repositories),
        "attachments": list(task.attachments),
        "start_agent": task.start_agent,
        "agent_profile": task.agent_profile,
        "state": task.phase,
        "archived": task.archived,
        "revision": task.revision,
        "created_at": task.created_on.isoformat(),
        "updated_at": task.modified_on.isoformat(),
    }
    if task.external_id is not None:
        dto["external_id"] = task.external_id
    return dto
