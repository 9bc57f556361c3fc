"""Parked creations, for a workspace's operators: the creations the recovery
Runtime gave up on, listed with their reason and evidence, and settled by a
retry (a fresh series of takeovers, after a repair) or an abort (every effect
removed, with evidence). Both idempotent by the Idempotency-Key, like a
release (runtime/settle.py)."""

from __future__ import annotations

from typing import Any

from flask import request
from flask.views import MethodView
from flask_smorest import Blueprint
from marshmallow import Schema, fields

from kandev_es.api.context import (
    idempotency_key,
    idempotency_key_parameter,
    path_uuid,
    principal,
    replayed_header,
    services,
)
from kandev_es.api.errors import document_errors
from kandev_es.domain.principal import require_operator
from kandev_es.errors import BadRequest, IdentityNotFound
from kandev_es.runtime.settle import SettleResult

blp = Blueprint(
    "parked", __name__, url_prefix="/api/v1", description="Parked creations (operators)"
)

KEY = idempotency_key_parameter(
    "the stable operation id: a replay answers the first call's creation"
)
TENURE = {
    "name": "tenure",
    "in": "query",
    "required": False,
    "schema": {"type": "integer", "minimum": 1},
    "description": "which parked tenure of the identity (default: its parked one)",
}


class ParkedStepSchema(Schema):
    # Beside its route (tests/unit/test_schemas_beside_routes.py), as the
    # creation status's own step schema is beside its.
    name = fields.String(required=True)
    status = fields.String(required=True)
    evidence = fields.Dict(required=True)


class ParkedCreationSchema(Schema):
    identity_id = fields.UUID(required=True)
    tenure = fields.Integer(required=True)
    workspace_id = fields.UUID(required=True)
    task_id = fields.UUID(required=True)
    external_id = fields.String(metadata={"description": "absent for an anonymous identity"})
    phase = fields.String(required=True)
    epoch = fields.Integer(required=True)
    takeovers = fields.Integer(required=True, metadata={"description": "in the current series"})
    reason = fields.String(required=True, metadata={"description": "why it was parked"})
    abort_reason = fields.String(allow_none=True, required=True)
    steps = fields.List(fields.Nested(ParkedStepSchema), required=True)


class ParkedListSchema(Schema):
    items = fields.List(fields.Nested(ParkedCreationSchema), required=True)


class SettleResultSchema(ParkedCreationSchema):
    action = fields.String(required=True, metadata={"description": "retry or abort"})
    operation_id = fields.String(required=True)


@blp.route("/workspaces/<workspace_id>/creations/parked")
class ParkedList(MethodView):
    @blp.response(200, ParkedListSchema)
    @document_errors(blp, 400, 403, 404, 503)
    def get(self, workspace_id: str) -> dict[str, Any]:
        """Creations the recovery Runtime gave up on (operator token)

        Every unfinished creation of the workspace that the recovery Runtime
        took over as often as it may and left to an operator, with why (its
        last takeover's failure), its phase, epoch and each step's state with
        full evidence. Settle each with retry or abort (docs/operations.md,
        "Parked creations")."""
        workspace = path_uuid(workspace_id, "workspace id")
        require_operator(principal(), workspace, needing="listing parked creations")
        return {"items": services().parked().list(workspace)}


def _settle(action: str, workspace_id: str, identity_id: str) -> Any:
    workspace = path_uuid(workspace_id, "workspace id")
    who = require_operator(
        principal(), workspace, IdentityNotFound("identity not found"), "settling a creation"
    )
    raw = request.args.get("tenure")
    if raw is not None and (not raw.isdigit() or not 1 <= int(raw) <= 2**31):
        raise BadRequest("tenure must be a positive integer", field="tenure")
    result: SettleResult = services().parked().settle(
        action,
        workspace,
        path_uuid(identity_id, "identity id"),
        idempotency_key(),
        actor=who.actor,
        tenure=int(raw) if raw is not None else None,
    )
    return result.body, 200, replayed_header(result.replayed)


@blp.route("/workspaces/<workspace_id>/creations/<identity_id>/retry")
class ParkedRetry(MethodView):
    @blp.doc(parameters=[KEY, TENURE])
    @blp.response(200, SettleResultSchema)
    @document_errors(blp, 400, 403, 404, 409, 422, 503)
    def post(self, workspace_id: str, identity_id: str) -> Any:
        """Retry a parked creation after a repair: a fresh series of takeovers

        After repairing what the reason names: records RecoveryRenewed and
        starts a fresh series of takeovers; the Runtime finishes the creation
        at its next scan (or parks it again). The Idempotency-Key is the
        operation id: a replay answers the same creation, marked
        Idempotent-Replayed, and changes nothing."""
        return _settle("retry", workspace_id, identity_id)


@blp.route("/workspaces/<workspace_id>/creations/<identity_id>/abort")
class ParkedAbort(MethodView):
    @blp.doc(parameters=[KEY, TENURE])
    @blp.response(200, SettleResultSchema)
    @document_errors(blp, 400, 403, 404, 409, 422, 502, 503)
    def post(self, workspace_id: str, identity_id: str) -> Any:
        """Abort a parked creation: remove its effects, forcibly if need be

        Records AbortForced, removes every effect the creation began (agent,
        worktree, branch), forcibly where its compensation fails, each with
        evidence, then Aborted: the identity is free. Not for a completing
        creation (409). 502 compensation_unproven while an effect stays: repair
        by hand and send the same call again (the Idempotency-Key finishes it)."""
        return _settle("abort", workspace_id, identity_id)
