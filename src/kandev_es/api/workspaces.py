"""Workspace and token administration (admin token), and workspace reads."""

from __future__ import annotations

from typing import Any

from flask.views import MethodView
from flask_smorest import Blueprint

from kandev_es.api import schemas
from kandev_es.api.context import json_object, path_uuid, principal, services
from kandev_es.domain.principal import Principal, require_operator
from kandev_es.errors import BadRequest, ValidationFailed, WorkspaceNotFound
from kandev_es.views import WorkspaceSchema, workspace_dto

blp = Blueprint("workspaces", __name__, url_prefix="/api/v1", description="Workspaces, tokens")


def _admin() -> Principal:
    who = principal()
    if who is None or not who.admin:
        # Non-admins learn nothing, not even that the route is admin-only.
        raise WorkspaceNotFound("workspace not found")
    return who


def _load(schema: Any, body: dict[str, Any]) -> dict[str, Any]:
    from marshmallow import ValidationError

    try:
        loaded: dict[str, Any] = schema().load(body)
    except ValidationError as error:
        raise ValidationFailed("invalid request", fields=error.messages) from None
    return loaded


@blp.route("/workspaces")
class WorkspaceCollection(MethodView):
    @blp.doc(
        requestBody={
            "required": True,
            "content": {"application/json": {"schema": schemas.WorkspaceCreateSchema}},
        }
    )
    @blp.response(201, WorkspaceSchema)
    def post(self) -> dict[str, Any]:
        _admin()
        body = _load(schemas.WorkspaceCreateSchema, json_object())
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
    @blp.response(200, schemas.WorkspaceDeletionSchema)
    def delete(self, workspace_id: str) -> dict[str, Any]:
        target = path_uuid(workspace_id, "workspace id")
        if services().workspaces.get(target) is None:
            raise WorkspaceNotFound("workspace not found")
        who = require_operator(principal(), target)
        return services().workspace_deletion.delete(target, actor=who.actor)


@blp.route("/tokens")
class TokenCollection(MethodView):
    @blp.doc(summary="List every token (admin): never a secret or its hash")
    @blp.response(200, schemas.TokenListSchema)
    def get(self) -> dict[str, Any]:
        _admin()
        return {"tokens": services().tokens.list_tokens()}

    @blp.doc(
        requestBody={
            "required": True,
            "content": {"application/json": {"schema": schemas.TokenCreateSchema}},
        }
    )
    @blp.response(201, schemas.TokenSchema)
    def post(self) -> dict[str, Any]:
        _admin()
        body = _load(schemas.TokenCreateSchema, json_object())
        workspace_id = body.get("workspace_id")
        if body["admin"] == (workspace_id is not None):
            raise BadRequest("give either workspace_id or admin: true")
        if workspace_id is not None and services().workspaces.get(workspace_id) is None:
            raise WorkspaceNotFound("workspace not found")
        secret, issued = services().tokens.issue(
            workspace_id=workspace_id, admin=body["admin"], label=body["label"],
            role=body["role"],
        )
        return {
            "token": secret, "admin": issued.admin, "workspace_id": issued.workspace_id,
            "role": issued.role,
        }


@blp.route("/tokens/<token_id>")
class TokenItem(MethodView):
    @blp.doc(summary="Revoke a token (admin); refused from its next request, idempotent")
    @blp.response(204)
    def delete(self, token_id: str) -> None:
        _admin()
        services().tokens.revoke(path_uuid(token_id, "token id"))
