"""Where a create lands -- its workspace, and its parent -- decided here for
every entry point:

- REST and the Office root create: the body's ``workspace_id``, else the
  token's workspace (``requested``);
- the Office subtask route: its parent's workspace (``under_parent``);
- MCP, when the arguments name no workspace: the parent's workspace, else the
  token's, else the only live one the caller may act on (``under_parent`` with
  ``default_workspace``).

Placement never authorizes (the protocol does, in its first read). A parent the
principal may not act on is answered as an unknown one, so a create never
reveals which task ids exist in another workspace. The parent a placement
loads is the one step 4 checks: it is loaded once per create."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from kandev_es.application import Tasks
from kandev_es.domain.principal import Principal
from kandev_es.domain.task import Task
from kandev_es.domain.workspace import Workspace
from kandev_es.errors import UnknownReference

OPENED_TOPIC = f"{Workspace.__module__}:{Workspace.Opened.__qualname__}"


@dataclass(frozen=True)
class Placement:
    """An entry point's decision, handed to the protocol with the body (which
    then ignores the body's ``workspace_id``): the workspace (None: the
    token's), and the parent as loaded while deciding (``parent_id`` None: none
    was loaded)."""

    workspace_id: uuid.UUID | None
    parent_id: uuid.UUID | None = None
    parent: Task | None = None


def requested(principal: Principal, raw_workspace: object) -> uuid.UUID | None:
    """The workspace a create names (None when it is malformed), else the
    token's: what the protocol authorizes."""
    if raw_workspace is None:
        return principal.workspace_id
    try:
        return uuid.UUID(str(raw_workspace))
    except ValueError:
        return None


def under_parent(
    app: Tasks,
    principal: Principal | None,
    parent_id: object,
    otherwise: Callable[[], uuid.UUID | None] = lambda: None,
) -> Placement:
    """The parent's workspace, even if the parent was deleted since (a task's
    workspace never changes, so a retry still reaches the identity it created).
    ``otherwise()`` when there is no principal, no parent, a malformed or
    unknown one, or one in a workspace the principal may not act on; the
    protocol then reports the parent after the lookup."""
    key = _uuid(parent_id)
    if principal is None or key is None:
        return Placement(otherwise())
    parent = app.load(key, Task)
    if parent is None or not principal.may_act_on(parent.workspace_id):
        return Placement(otherwise(), key, parent)
    return Placement(parent.workspace_id, key, parent)


def default_workspace(app: Tasks, principal: Principal | None) -> uuid.UUID | None:
    """For a caller that named no workspace (MCP): the token's, else the only
    live workspace the principal may act on."""
    if principal is None:
        return None
    if principal.workspace_id is not None:
        return principal.workspace_id
    return only_live(app, principal)


def only_live(app: Tasks, principal: Principal) -> uuid.UUID | None:
    """The single live workspace the principal may act on, or None when there
    are none or several."""
    found: uuid.UUID | None = None
    for workspace_id in app.originators(OPENED_TOPIC):
        if not principal.may_act_on(workspace_id):
            continue
        workspace = app.load(workspace_id, Workspace)
        if workspace is None or workspace.deleted:
            continue
        if found is not None and found != workspace_id:
            return None
        found = workspace_id
    return found


def check_parent(
    app: Tasks, workspace: Workspace, parent_id: uuid.UUID, placed: Placement | None = None
) -> None:
    """A new task's parent is a live task of the same workspace (step 4); the
    parent placement loaded is not loaded again."""
    if placed is not None and placed.parent_id == parent_id:
        parent = placed.parent
    else:
        parent = app.load(parent_id, Task)
    if parent is None or parent.deleted or parent.workspace_id != workspace.id:
        raise UnknownReference("unknown parent task", field="parent_id")


def _uuid(value: object) -> uuid.UUID | None:
    if value is None:
        return None
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None
