"""Identity history for auditors: the identity's whole stream across tenures,
as JSON. The auditor's page's rule (``require_auditor``): an admin or an operator
token of the workspace; a member gets 403, anyone else 404 and learns nothing."""

from __future__ import annotations

from typing import Any

from flask import request
from flask.views import MethodView
from flask_smorest import Blueprint

from kandev_es.api.context import path_uuid, principal, services
from kandev_es.domain.external_id import require_external_id
from kandev_es.domain.principal import require_auditor
from kandev_es.services.history import identity_history

blp = Blueprint("identities", __name__, url_prefix="/api/v1", description="Identity audit")


@blp.route("/workspaces/<workspace_id>/identities/history")
class IdentityHistory(MethodView):
    @blp.doc(
        summary="An identity's whole stream across tenures (admin or operator token)",
        parameters=[
            {"name": "external_id", "in": "query", "required": True, "schema": {"type": "string"}}
        ],
        responses={200: {"description": "identity, holder and every event in order"}},
    )
    def get(self, workspace_id: str) -> dict[str, Any]:
        target = path_uuid(workspace_id, "workspace id")
        require_auditor(principal(), target)
        external_id = require_external_id(request.args.get("external_id"))
        return identity_history(services().app, target, external_id, full=True)
