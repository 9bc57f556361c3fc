"""Workspaces: open (admin), read, delete (admin or operator)."""

from __future__ import annotations

from typing import Any

from flask.views import MethodView
from flask_smorest import Blueprint
from marshmallow import Schema, fields

from kandev_es.api.context import (
    json_object,
    load_body,
    path_uuid,
    principal,
    require_admin,
    services,
)
from kandev_es.api.errors import document_errors
from kandev_es.domain.principal import require_operator
from kandev_es.errors import WorkspaceNotFound
from kandev_es.views import WorkspaceSchema, workspace_dto

blp = Blueprint("workspaces", __name__, url_prefix="/api/v1", description="Workspaces")


class WorkspaceCreateSchema(Schema):
    name = fields.String(required=True)
    task_prefix = fields.String(load_default="KAN")


class WorkspaceDeletionSchema(Schema):
    workspace_id = fields.UUID(required=True)
    deletion_generation = fields.Integer(required=True)
    tasks_removed = fields.Integer(required=True)


@blp.route("/workspaces")
class WorkspaceCollection(MethodView):
    @blp.doc(
        requestBody={
            "required": True,
            "content": {"application/json": {"schema": WorkspaceCreateSchema}},
        }
    )
    @blp.response(201, WorkspaceSchema)
    @document_errors(blp, 400, 404, 409, 413, 422)
    def post(self) -> dict[str, Any]:
        """Open a workspace (admin)

        `task_prefix` names its tasks (`KAN` makes `KAN-1`, `KAN-2`, …): choose one
        that differs from the external system's keys, so a task's identifier and
        its external ID cannot be confused. A name already taken answers 409.
        """
        require_admin()
        body = load_body(WorkspaceCreateSchema, json_object())
        workspace = services().workspaces.open(body["name"], body["task_prefix"])
        return workspace_dto(workspace)


@blp.route("/workspaces/<workspace_id>")
class WorkspaceItem(MethodView):
    @blp.response(200, WorkspaceSchema)
    @document_errors(blp, 400, 404)
    def get(self, workspace_id: str) -> dict[str, Any]:
        """Get a workspace

        Its name, task prefix, current WIP limit (`null`: none) and registered
        repositories' names.
        """
        target = path_uuid(workspace_id, "workspace id")
        who = principal()
        workspace = services().workspaces.get(target)
        if who is None or workspace is None or not who.may_act_on(target):
            raise WorkspaceNotFound("workspace not found")
        return workspace_dto(workspace)


    @blp.response(200, WorkspaceDeletionSchema)
    @document_errors(blp, 400, 403, 404, 503)
    def delete(self, workspace_id: str) -> dict[str, Any]:
        """Delete a workspace (admin or its operator)

        Fences the workspace's creations (a create that lands after it is refused),
        removes its tasks and its webhook subscriptions and frees every identity.
        The answer says how many tasks went and the deletion's generation.
        """
        target = path_uuid(workspace_id, "workspace id")
        if services().workspaces.get(target) is None:
            raise WorkspaceNotFound("workspace not found")
        who = require_operator(principal(), target)
        deleted = services().workspace_deletion.delete(target, actor=who.actor)
        services().webhooks.service.forget_workspace(target)  # and their secrets
        return deleted
