"""Token administration (admin token): issue, list, revoke."""

from __future__ import annotations

from typing import Any

from flask.views import MethodView
from flask_smorest import Blueprint
from marshmallow import Schema, fields, validate

from kandev_es.api.context import json_object, load_body, path_uuid, require_admin, services
from kandev_es.api.errors import document_errors
from kandev_es.errors import BadRequest, WorkspaceNotFound

blp = Blueprint("tokens", __name__, url_prefix="/api/v1", description="Tokens")


class TokenCreateSchema(Schema):
    workspace_id = fields.UUID()
    admin = fields.Boolean(load_default=False)
    label = fields.String(load_default="")
    role = fields.String(
        load_default="member",
        validate=validate.OneOf(["member", "operator"]),
        metadata={"description": "workspace tokens: member, or operator (release, "
                  "repositories, policy, workspace deletion, task deletion)"},
    )


class TokenSchema(Schema):
    id = fields.UUID(required=True, metadata={"description": "what DELETE /tokens/<id> takes"})
    token = fields.String(required=True, metadata={"description": "shown once; stored hashed"})
    admin = fields.Boolean(required=True)
    workspace_id = fields.UUID(allow_none=True)
    role = fields.String(required=True)


class TokenInfoSchema(Schema):
    """A listed token: never its secret or its hash."""

    id = fields.UUID(required=True)
    role = fields.String(
        required=True,
        metadata={"description": "admin, operator, member, or run (a run credential)"},
    )
    workspace_id = fields.UUID(allow_none=True)
    label = fields.String(required=True)
    run_id = fields.String(allow_none=True)
    created_on = fields.DateTime(required=True)
    revoked = fields.Boolean(required=True)


class TokenListSchema(Schema):
    tokens = fields.List(fields.Nested(TokenInfoSchema), required=True)


@blp.route("/tokens")
class TokenCollection(MethodView):
    @blp.response(200, TokenListSchema)
    @document_errors(blp, 400, 404)
    def get(self) -> dict[str, Any]:
        """List every token (admin)

        Ids, roles, workspaces, labels and whether each is revoked: never a secret
        or its hash. Run credentials of agent runs are listed too (role `run`).
        """
        require_admin()
        return {"tokens": services().tokens.list_tokens()}

    @blp.doc(
        requestBody={
            "required": True,
            "content": {"application/json": {"schema": TokenCreateSchema}},
        }
    )
    @blp.response(201, TokenSchema)
    @document_errors(blp, 400, 404, 413, 422)
    def post(self) -> dict[str, Any]:
        """Issue a token (admin)

        Either for one workspace (`workspace_id`, role `member` or `operator`) or an
        admin token (`admin: true`). The secret is in this answer only; the store
        keeps its hash.
        """
        require_admin()
        body = load_body(TokenCreateSchema, json_object())
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
            "id": issued.token_id, "token": secret, "admin": issued.admin,
            "workspace_id": issued.workspace_id, "role": issued.role,
        }


@blp.route("/tokens/<token_id>")
class TokenItem(MethodView):
    @blp.response(204)
    @document_errors(blp, 400, 404)
    def delete(self, token_id: str) -> None:
        """Revoke a token (admin)

        Refused from its next request on, in every worker; revoking it again is
        harmless. 404 `token_not_found` for an id no token has.
        """
        require_admin()
        services().tokens.revoke(path_uuid(token_id, "token id"))
