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
    def post(self) -> dict[str, Any]:
        require_admin()
        body = load_body(WorkspaceCreateSchema, json_object())
        workspace = services().workspaces.open(body["name"], body["task_prefix"])
        return workspace_dto(workspace)


@blp.route("/workspaces/<workspace_id>")
class WorkspaceItem(MethodView):
    @blp.response(200, WorkspaceSchema)
    def get(self, workspace_id: str) -> dict[str, Any]:
        target = path_uuid(workspace_id, "workspace id")
        who = principal()
        workspace = services().workspaces.get(target)
        if who is None or workspace is None or not who.may_act_on(target):
            raise WorkspaceNotFound("workspace not found")
        return workspace_dto(workspace)


    @blp.doc(summary="Delete a workspace (admin): fences creations, frees every identity")
    @blp.response(200, WorkspaceDeletionSchema)
    def delete(self, workspace_id: str) -> dict[str, Any]:
        target = path_uuid(workspace_id, "workspace id")
        if services().workspaces.get(target) is None:
            raise WorkspaceNotFound("workspace not found")
        who = require_operator(principal(), target)
        return services().workspace_deletion.delete(target, actor=who.actor)
