"""Which workspace a tool call acts on, when the caller did not say.

Order: the explicit workspace_id; else the parent task's workspace (creates with
parent_id); else the token's workspace; else the only workspace, when exactly
one exists. Resolution never decides authorization — the services do — and a
workspace the principal may not act on is never picked."""

from __future__ import annotations

import uuid

from kandev_es.bootstrap import Services
from kandev_es.domain.task import Task
from kandev_es.domain.workspace import Workspace
from kandev_es.services.auth import Principal

OPENED_TOPIC = f"{Workspace.__module__}:{Workspace.Opened.__qualname__}"
PAGE = 500


def resolve_workspace(
    services: Services, principal: Principal | None, parent_id: object = None
) -> uuid.UUID | None:
    if principal is None:
        return None
    parent_workspace = _parent_workspace(services, principal, parent_id)
    if parent_workspace is not None:
        return parent_workspace
    if principal.workspace_id is not None:
        return principal.workspace_id
    return only_workspace(services)


def _parent_workspace(
    services: Services, principal: Principal, parent_id: object
) -> uuid.UUID | None:
    """The parent's stream, even if the parent was deleted since: a task's
    workspace never changes, so a retry still reaches the identity it created."""
    if parent_id is None:
        return None
    try:
        key = uuid.UUID(str(parent_id))
    except ValueError:
        return None  # the protocol reports it, after the lookup
    parent = services.app.load(key, Task)
    if parent is None or not principal.may_act_on(parent.workspace_id):
        return None
    return parent.workspace_id


def only_workspace(services: Services) -> uuid.UUID | None:
    """The single live workspace, or None when there are none or several."""
    found: uuid.UUID | None = None
    start = 1
    while True:
        batch = services.app.recorder.select_notifications(
            start=start, limit=PAGE, topics=[OPENED_TOPIC]
        )
        for notification in batch:
            workspace_id = uuid.UUID(str(notification.originator_id))
            if services.workspaces.get(workspace_id) is None:
                continue  # deleted
            if found is not None and found != workspace_id:
                return None
            found = workspace_id
        if len(batch) < PAGE:
            return found
        start = batch[-1].id + 1
