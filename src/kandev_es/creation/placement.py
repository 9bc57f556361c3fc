"""Where a create lands: the parent task's workspace, for REST, Office and MCP
alike. A parent the principal may not act on is answered as an unknown one, so a
create never reveals which task ids exist in another workspace."""

from __future__ import annotations

import uuid

from kandev_es.application import Tasks
from kandev_es.domain.principal import Principal
from kandev_es.domain.task import Task
from kandev_es.domain.workspace import Workspace
from kandev_es.errors import UnknownReference


def parent_workspace(
    app: Tasks, principal: Principal | None, parent_id: object
) -> uuid.UUID | None:
    """The parent's workspace, even if the parent was deleted since (a task's
    workspace never changes, so a retry still reaches the identity it created).
    None when there is no principal, no parent, a malformed or unknown one, or
    one in a workspace the principal may not act on: the caller then falls back
    to its own workspace and the protocol reports the parent after the lookup."""
    if principal is None or parent_id is None:
        return None
    try:
        key = uuid.UUID(str(parent_id))
    except ValueError:
        return None
    parent = app.load(key, Task)
    if parent is None or not principal.may_act_on(parent.workspace_id):
        return None
    return parent.workspace_id


def check_parent(app: Tasks, workspace: Workspace, parent_id: uuid.UUID) -> None:
    """A new task's parent is a live task of the same workspace (step 4)."""
    parent = app.load(parent_id, Task)
    if parent is None or parent.deleted or parent.workspace_id != workspace.id:
        raise UnknownReference("unknown parent task", field="parent_id")
