"""Workspace resources used by creations: repositories, attachments, WIP
policy; and the creator's private view of its own creation."""

from __future__ import annotations

import uuid
from typing import Any

from flask import request
from flask.views import MethodView
from flask_smorest import Blueprint
from marshmallow import Schema, fields, validate

from kandev_es.api.context import json_object, load_body, path_uuid, principal, services
from kandev_es.api.errors import document_errors
from kandev_es.domain.principal import require_operator
from kandev_es.errors import BadRequest, WorkspaceNotFound

blp = Blueprint("resources", __name__, url_prefix="/api/v1", description="Workspace resources")


class RepositorySchema(Schema):
    name = fields.String(required=True, validate=validate.Length(min=1, max=100))
    path = fields.String(required=True, metadata={"description": "absolute local git path"})


class RepositoryListedSchema(Schema):
    name = fields.String(required=True)
    path = fields.String(metadata={"description": "shown to operators and admins only"})


class AttachmentSchema(Schema):
    id = fields.String(required=True, metadata={"example": "sha256:…"})
    sha256 = fields.String(required=True)
    filename = fields.String(
        required=True,
        allow_none=True,
        metadata={"description": "null once forgotten with the task that claimed it"},
    )
    size = fields.Integer(required=True)
    content_type = fields.String(required=True)
    claimed_by = fields.UUID(allow_none=True, required=True)


MAX_WIP_LIMIT = 100_000


class PolicySchema(Schema):
    wip_limit = fields.Integer(
        allow_none=True,
        required=True,
        validate=validate.Range(min=1, max=MAX_WIP_LIMIT),
        metadata={"description": f"1..{MAX_WIP_LIMIT} active tasks, or null for no limit"},
    )


class CreationStepSchema(Schema):
    name = fields.String(required=True)
    status = fields.String(required=True)
    evidence = fields.Dict(required=True)


class CreationStatusSchema(Schema):
    task_id = fields.UUID(required=True)
    tenure = fields.Integer(required=True)
    phase = fields.String(required=True)
    epoch = fields.Integer(required=True)
    released = fields.Boolean(required=True)
    outcome = fields.String(allow_none=True, required=True)
    plan_hash = fields.String(required=True)
    request_id = fields.String(
        allow_none=True,
        required=True,
        metadata={"description": "the X-Request-Id of the request that claimed it"},
    )
    steps = fields.List(fields.Nested(CreationStepSchema), required=True)


def _member_of(workspace_id: str) -> uuid.UUID:
    target = path_uuid(workspace_id, "workspace id")
    who = principal()
    if who is None or not who.may_act_on(target) or services().workspaces.get(target) is None:
        raise WorkspaceNotFound("workspace not found")
    return target


@blp.route("/workspaces/<workspace_id>/repositories")
class Repositories(MethodView):
    @blp.doc(
        requestBody={
            "required": True,
            "content": {"application/json": {"schema": RepositorySchema}},
        }
    )
    @blp.response(201, RepositorySchema)
    @document_errors(blp, 400, 403, 404, 413, 422)
    def post(self, workspace_id: str) -> dict[str, str]:
        """Register a git repository (operator)

        Creates that name it get a branch `kandev/<identifier>` and a worktree of
        it. `path` must be the top of its own git work tree on the server's
        machine; the name is letters, digits and `_.-`.
        """
        target = _member_of(workspace_id)
        require_operator(principal(), target)
        body = load_body(RepositorySchema, json_object())
        return services().repositories.register(target, body["name"], body["path"])

    @blp.response(200, RepositoryListedSchema(many=True))
    @document_errors(blp, 400, 404)
    def get(self, workspace_id: str) -> list[dict[str, str]]:
        """List the workspace's repositories

        Names for every member; their paths on the server only for operators and
        admins.
        """
        target = _member_of(workspace_id)
        who = principal()
        with_paths = who is not None and who.is_operator_of(target)
        return services().repositories.list(target, with_paths=with_paths)


@blp.route("/workspaces/<workspace_id>/attachments")
class Attachments(MethodView):
    @blp.doc(
        parameters=[
            {"name": "filename", "in": "query", "required": True, "schema": {"type": "string"},
             "description": "the file's name (a multipart upload's own name is used if empty)"}
        ],
        requestBody={
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        },
    )
    @blp.response(201, AttachmentSchema)
    @document_errors(blp, 400, 404, 413, 422)
    def post(self, workspace_id: str) -> dict[str, Any]:
        """Upload an attachment

        The raw body is the file (`?filename=` names it; a multipart `file` field is
        accepted too). Content-addressed: the same bytes again answer the same
        `sha256:…` id. A create lists ids in `attachments` to claim them.
        """
        target = _member_of(workspace_id)
        filename = request.args.get("filename", "")
        if "file" in request.files:
            upload = request.files["file"]
            content, filename = upload.read(), filename or (upload.filename or "")
        else:
            content = request.get_data()
        return services().attachments.upload(
            target, filename, content, request.mimetype or "application/octet-stream"
        )


@blp.route("/workspaces/<workspace_id>/policy")
class Policy(MethodView):
    @blp.doc(
        requestBody={"required": True, "content": {"application/json": {"schema": PolicySchema}}}
    )
    @blp.response(200, PolicySchema)
    @document_errors(blp, 400, 403, 404, 413, 422)
    def put(self, workspace_id: str) -> dict[str, Any]:
        """Set the workspace's WIP limit (operator)

        At most `wip_limit` active tasks; a create past it is refused (409
        `capacity_exhausted`) and writes nothing. `null` removes the limit.
        """
        target = _member_of(workspace_id)
        require_operator(principal(), target)
        body = load_body(PolicySchema, json_object())
        workspace = services().workspaces.set_wip_limit(target, body["wip_limit"])
        return {"wip_limit": workspace.wip_limit}


@blp.route("/creations/<handle>")
class CreationStatus(MethodView):
    @blp.response(200, CreationStatusSchema)
    @document_errors(blp, 400, 404)
    def get(self, handle: str) -> dict[str, Any]:
        """The creator's own creation: phase and step states

        `handle` is the private `creation_handle` of a `created` answer; with the
        same token it shows that creation's phase and each step's status and
        evidence. Anyone else gets 404.
        """
        if len(handle) > 200:
            raise BadRequest("handle too long")
        return services().creation_status.status(principal(), handle)
