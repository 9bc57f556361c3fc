"""Identity history for auditors (admin token only): the identity's whole
stream across tenures, as JSON. Anyone else gets 404 and learns nothing."""

from __future__ import annotations

from typing import Any

from flask import request
from flask.views import MethodView
from flask_smorest import Blueprint

from kandev_es.api.context import path_uuid, principal, services
from kandev_es.domain.external_id import require_external_id
from kandev_es.errors import IdentityNotFound
from kandev_es.services.history import identity_history

blp = Blueprint("identities", __name__, url_prefix="/api/v1", description="Identity audit")


@blp.route("/workspaces/<workspace_id>/identities/history")
class IdentityHistory(MethodView):
    @blp.doc(
        summary="An identity's whole stream across tenures (admin token)",
        parameters=[
            {"name": "external_id", "in": "query", "required": True, "schema": {"type": "string"}}
        ],
        responses={200: {"description": "identity, holder and every event in order"}},
    )
    def get(self, workspace_id: str) -> dict[str, Any]:
        who = principal()
        if who is None or not who.admin:
            raise IdentityNotFound("identity not found")
        target = path_uuid(workspace_id, "workspace id")
        external_id = require_external_id(request.args.get("external_id"))
        return identity_history(services().app, target, external_id)
