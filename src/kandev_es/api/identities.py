"""Identity history for auditors: the identity's whole stream across tenures,
as JSON. The auditor's page's rule (``require_auditor``): an admin or an operator
token of the workspace; a member gets 403, anyone else 404 and learns nothing.
With ``proof=1`` the answer carries the identity's proof bundle; the latest
signed checkpoint and consistency proofs (docs/auditing.md) hold only sizes and
hashes and are served to any valid token."""

from __future__ import annotations

from typing import Any

from flask import request
from flask.views import MethodView
from flask_smorest import Blueprint
from marshmallow import Schema, fields

from kandev_es.api.context import path_uuid, principal, services
from kandev_es.api.errors import document_errors
from kandev_es.domain.external_id import require_external_id
from kandev_es.domain.principal import require_auditor
from kandev_es.errors import InvalidCheckpointRange, Unauthenticated
from kandev_es.services import ledger
from kandev_es.services.history import identity_history

blp = Blueprint("identities", __name__, url_prefix="/api/v1", description="Identity audit")


class HolderSchema(Schema):
    tenure = fields.Integer(required=True)
    task_id = fields.UUID(required=True)
    phase = fields.String(required=True)


class IdentityHistorySchema(Schema):
    """services/history.py identity_history, as documented (the route answers it as built)."""

    identity_id = fields.UUID(required=True)
    workspace_id = fields.UUID(required=True)
    external_id = fields.String(required=True)
    holder = fields.Nested(HolderSchema, allow_none=True, required=True,
                           metadata={"description": "null: nothing holds it now"})
    tenures = fields.Integer(required=True)
    events = fields.List(
        fields.Dict(), required=True,
        metadata={"description": "every event in order: version, timestamp, event (its "
                  "name, e.g. Claimed, Completed, Released, Aborted) and its fields"},
    )


@blp.route("/workspaces/<workspace_id>/identities/history")
class IdentityHistory(MethodView):
    @blp.doc(
        parameters=[
            {"name": "external_id", "in": "query", "required": True, "schema": {"type": "string"}},
            {"name": "proof", "in": "query", "required": False,
             "schema": {"type": "string", "enum": ["0", "1"]},
             "description": "1: add the proof bundle (events as stored, chain, inclusion"
             " proofs against the latest checkpoint) under `proof`"},
        ],
        responses={
            200: {
                "description": "identity, holder and every event in order",
                "content": {"application/json": {"schema": IdentityHistorySchema}},
            }
        },
    )
    @document_errors(blp, 400, 403, 404, 503)
    def get(self, workspace_id: str) -> dict[str, Any]:
        """An identity's whole history across tenures (admin or operator token)

        Every event of the identity's stream, straight from the event store: each
        claim, step, completion, abort and release, with who did it. For auditors:
        a member token gets 403, anyone else 404 and learns nothing.
        """
        target = path_uuid(workspace_id, "workspace id")
        require_auditor(principal(), target)
        external_id = require_external_id(request.args.get("external_id"))
        history = identity_history(services().app, target, external_id, full=True)
        if request.args.get("proof") == "1":
            history["proof"] = ledger.proof_bundle(
                services().app, services().database, target, external_id
            )
        return history


def _any_token() -> None:
    if principal() is None:
        raise Unauthenticated("a valid bearer token is needed")


def _size(name: str, required: bool) -> int | None:
    raw = request.args.get(name)
    if raw is None and not required:
        return None
    if raw is None or not raw.isdigit() or not 0 < int(raw) < 1 << 62:
        raise InvalidCheckpointRange(f"{name} must be a tree size above 0")
    return int(raw)


@blp.route("/ledger/checkpoint")
class LatestCheckpoint(MethodView):
    @blp.doc(
        summary="The latest signed checkpoint of the Merkle log (C2SP signed note, text)",
        responses={200: {"description": "the note", "content": {"text/plain": {}}},
                   404: {"description": "no checkpoint signed yet"}},
    )
    def get(self) -> tuple[str, int, dict[str, str]]:
        _any_token()
        return ledger.latest_checkpoint(services().database), 200, {
            "Content-Type": "text/plain; charset=utf-8"}


@blp.route("/ledger/consistency")
class Consistency(MethodView):
    @blp.doc(
        summary="A consistency proof between two signed checkpoints (kandev-es-verify)",
        parameters=[
            {"name": "from", "in": "query", "required": True, "schema": {"type": "integer"}},
            {"name": "to", "in": "query", "required": False, "schema": {"type": "integer"},
             "description": "default: the latest checkpoint"},
        ],
        responses={200: {"description": "both checkpoints and the proof"},
                   404: {"description": "no signed checkpoint of that size"}},
    )
    def get(self) -> dict[str, Any]:
        _any_token()
        old = _size("from", True)
        assert old is not None
        return ledger.consistency(services().database, old, _size("to", False))
