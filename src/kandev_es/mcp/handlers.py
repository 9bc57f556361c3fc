"""What each tool does: parse its arguments, call the one service, return the
REST-shaped body. Typed errors propagate; ``mcp.errors`` maps them once."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

from marshmallow import ValidationError

from kandev_es.bootstrap import Services
from kandev_es.creation import placement
from kandev_es.domain.principal import Principal
from kandev_es.errors import BadRequest, TaskNotFound, ValidationFailed
from kandev_es.mcp import tools
from kandev_es.views import task_dto

Handler = Callable[[Services, Principal | None, Mapping[str, Any]], dict[str, Any]]


def create_task(
    services: Services, principal: Principal | None, arguments: Mapping[str, Any]
) -> dict[str, Any]:
    """The create protocol, with the arguments as the body — unvalidated, so the
    identity lookup answers before any request-specific validation (AC-4).
    Arguments that name no workspace land where placement decides: the
    parent's, else the token's, else the only live one."""
    body = dict(arguments)
    placed = None
    if body.get("workspace_id") is None:
        body.pop("workspace_id", None)
        placed = placement.under_parent(
            services.app,
            principal,
            body.get("parent_id"),
            lambda: placement.default_workspace(services.app, principal),
        )
    body.setdefault("start_agent", True)  # MCP's default; REST's is false
    return services.creation.create(principal, body, placed).to_response()


def get_task(
    services: Services, principal: Principal | None, arguments: Mapping[str, Any]
) -> dict[str, Any]:
    task = services.tasks.get(principal, _uuid(arguments.get("task_id"), "task_id"))
    return task_dto(task)


def list_tasks(
    services: Services, principal: Principal | None, arguments: Mapping[str, Any]
) -> dict[str, Any]:
    try:
        query: dict[str, Any] = tools.ListTasksArguments().load(dict(arguments))
    except ValidationError as error:
        raise ValidationFailed("invalid list_tasks arguments", fields=error.messages) from None
    workspace = query["workspace_id"] or placement.default_workspace(services.app, principal)
    if principal is None or workspace is None or not principal.may_act_on(workspace):
        raise TaskNotFound("task not found")
    return services.tasks.list(
        workspace,
        after=query["after"],
        limit=query["limit"],
        include_archived=query["include_archived"],
    ).to_dict()


def update_task(
    services: Services, principal: Principal | None, arguments: Mapping[str, Any]
) -> dict[str, Any]:
    """The task patch; the service rejects external_id (immutable) first."""
    body = dict(arguments)
    task_id = _uuid(body.pop("task_id", None), "task_id")
    revision = body.pop("if_revision", None)
    if revision is not None and (isinstance(revision, bool) or not isinstance(revision, int)):
        raise BadRequest("if_revision must be a task revision (an integer)")
    return services.tasks.patch(principal, task_id, body, revision)


def _uuid(value: object, name: str) -> uuid.UUID:
    if value is None:
        raise BadRequest(f"{name} is required")
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise BadRequest(f"{name} must be a UUID") from None


HANDLERS: dict[str, Handler] = {
    tools.CREATE_TASK: create_task,
    tools.GET_TASK: get_task,
    tools.LIST_TASKS: list_tasks,
    tools.UPDATE_TASK: update_task,
}
