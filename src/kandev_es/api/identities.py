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
from kandev_es.errors import CheckpointNotFound, InvalidCheckpointRange
from kandev_es.services import ledger
from kandev_es.services.history import identity_history

MAX_HELD = 16  # consistency_from sizes one request may ask proofs from
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
    proof = fields.Dict(
        metadata={"description": "with proof=1: the proof bundle (kandev-es/proof-bundle/v1: "
                  "the events as stored, their chain hashes and inclusion proofs against "
                  "the latest signed checkpoint; kandev-es-verify bundle checks it)"},
    )


@blp.route("/workspaces/<workspace_id>/identities/history")
class IdentityHistory(MethodView):
    @blp.doc(
        parameters=[
            {"name": "external_id", "in": "query", "required": True, "schema": {"type": "string"},
             "description": "the external ID whose history to show (held or released)"},
            {"name": "proof", "in": "query", "required": False,
             "schema": {"type": "string", "enum": ["0", "1"]},
             "description": "1: add the proof bundle (events as stored, chain, inclusion"
             " proofs against the latest checkpoint) under `proof`"},
            {"name": "consistency_from", "in": "query", "required": False,
             "schema": {"type": "array", "items": {"type": "integer", "minimum": 1}},
             "style": "form", "explode": True,
             "description": "with proof=1: the size of a checkpoint you hold (repeatable);"
             " the bundle then carries a consistency proof from it to its own checkpoint,"
             " which `kandev-es-verify bundle --checkpoint` checks"},
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
            raws = request.args.getlist("consistency_from")
            if len(raws) > MAX_HELD:
                raise InvalidCheckpointRange(f"at most {MAX_HELD} consistency_from sizes")
            sizes = [_size_of("consistency_from", raw) for raw in raws]
            history["proof"] = ledger.proof_bundle(
                services().app, services().database, target, external_id, sizes
            )
        return history


def _any_token() -> None:
    # As everywhere here: a missing, unknown or revoked token learns nothing (404).
    if principal() is None:
        raise CheckpointNotFound("checkpoint not found")


def _size(name: str, required: bool) -> int | None:
    raw = request.args.get(name)
    if raw is None and not required:
        return None
    return _size_of(name, raw)


def _size_of(name: str, raw: str | None) -> int:
    if raw is None or not raw.isascii() or not raw.isdigit() or not 0 < int(raw) < 1 << 62:
        raise InvalidCheckpointRange(f"{name} must be a tree size above 0")
    return int(raw)


class CheckpointSchema(Schema):
    checkpoint = fields.String(
        required=True,
        metadata={"description": "a C2SP tlog-checkpoint (origin, tree size, base64 root) "
                  "signed as a C2SP signed note with Ed25519"},
    )


class ConsistencySchema(Schema):
    format = fields.String(required=True, metadata={"example": "kandev-es/consistency-proof/v1"})
    old = fields.String(required=True, metadata={"description": "the older signed checkpoint"})
    new = fields.String(required=True, metadata={"description": "the newer signed checkpoint"})
    proof = fields.List(fields.String(), required=True,
                        metadata={"description": "RFC 9162 consistency proof, base64 hashes"})


@blp.route("/ledger/checkpoint")
class LatestCheckpoint(MethodView):
    @blp.response(200, CheckpointSchema)
    @document_errors(blp, 404, 503)
    def get(self) -> dict[str, str]:
        """The latest signed checkpoint of the Merkle log (any valid token)

        The sequencer logs every event and signs a checkpoint every few seconds
        (docs/auditing.md). Keep checkpoints outside the database's reach; check
        them with `kandev-es-verify checkpoint` and the public keyring. 404 until the
        first one is signed.
        """
        _any_token()
        return {"checkpoint": ledger.latest_checkpoint(services().database)}


@blp.route("/ledger/consistency")
class Consistency(MethodView):
    @blp.doc(
        parameters=[
            {"name": "from", "in": "query", "required": True,
             "schema": {"type": "integer", "minimum": 1},
             "description": "the older checkpoint's tree size"},
            {"name": "to", "in": "query", "required": False,
             "schema": {"type": "integer", "minimum": 1},
             "description": "the newer checkpoint's tree size (default: the latest)"},
        ],
    )
    @blp.response(200, ConsistencySchema)
    @document_errors(blp, 400, 404, 503)
    def get(self) -> dict[str, Any]:
        """A consistency proof between two signed checkpoints (any valid token)

        Proves that the log at the newer size extends the log at the older one:
        nothing the older checkpoint covered has changed. `kandev-es-verify
        consistency` checks it offline. 404 for a size no checkpoint was signed at.
        """
        _any_token()
        old = _size("from", True)
        assert old is not None
        return ledger.consistency(services().database, old, _size("to", False))
