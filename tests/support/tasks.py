"""A task aggregate with the fields a bare create gives (no repositories, no
attachments, no agent), for tests that write store state directly."""

from __future__ import annotations

import uuid

from kandev_es.domain.task import Task


def bare_task(
    task_id: uuid.UUID,
    *,
    workspace_id: uuid.UUID,
    identity_id: uuid.UUID,
    identifier: str,
    external_id: str,
    title: str,
    created_by: str,
) -> Task:
    return Task.create(
        task_id,
        workspace_id=workspace_id,
        identity_id=identity_id,
        identifier=identifier,
        external_id=external_id,
        title=title,
        description="",
        workflow="default",
        workflow_step="backlog",
        parent_id=None,
        repositories=[],
        attachments=[],
        start_agent=False,
        agent_profile=None,
        created_by=created_by,
    )
