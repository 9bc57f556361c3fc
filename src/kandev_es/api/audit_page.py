"""The auditor's page: ``GET /audit/identities?workspace=W&external_id=E``, an
identity's history as a server-rendered HTML timeline (no JavaScript at all).

Who may look: an admin token, an operator token of that workspace (bearer
header), or an audit link (``?audit_link=``, printed by ``identity history``)
issued for exactly this identity and not yet expired. The identity's proof
bundle (``GET /audit/identities/proof``, offered on the page) holds the events
as stored, unredacted, so only those who read the full history get it (an
admin or an operator token); an audit link's redacted reader gets 403. The API's conventions
hold: a member of the workspace gets 403 operator_required, anyone else 404
``identity not found``; bad query input is a typed 400. Errors are HTML pages
with those statuses and codes. Everything rendered is autoescaped, and a
strict CSP forbids scripts, so a hostile external id or title stays text.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

from flask import Blueprint, Response, render_template, request, url_for
from flask.typing import ResponseReturnValue

from kandev_es.api.context import principal, services
from kandev_es.domain.external_id import require_external_id
from kandev_es.domain.principal import require_auditor
from kandev_es.errors import BadRequest, KandevError, OperatorRequired, http_status
from kandev_es.services.audit_links import LINK_PARAMETER
from kandev_es.services.audit_timeline import identity_timeline
from kandev_es.services.ledger import identity_verification, proof_bundle

blp = Blueprint(
    "audit_page",
    __name__,
    url_prefix="/audit",
    template_folder="templates",
    static_folder="static",
    static_url_path="/static",
)

# No script from anywhere; styles and images only from this origin (the CSS file).
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)


def _workspace() -> uuid.UUID:
    raw = request.args.get("workspace")
    if not raw:
        raise BadRequest("workspace (a workspace id) is required", parameter="workspace")
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise BadRequest("workspace must be a UUID", parameter="workspace") from None


def _authorize(workspace_id: uuid.UUID, external_id: str) -> bool:
    """Whether the reader sees the full record: an operator or admin token
    does; an audit link (a URL anyone it was handed to can open) gets the
    redacted view (domain/disclosure.py)."""
    link = request.args.get(LINK_PARAMETER)
    if link is not None and services().audit_links.permits(link, workspace_id, external_id):
        return False
    require_auditor(principal(), workspace_id)  # the JSON history route's rule too
    return True


def _render(template: str, http_status: int, **values: object) -> ResponseReturnValue:
    rendered_at = datetime.now(UTC).isoformat(timespec="seconds")
    return render_template(template, rendered_at=rendered_at, **values), http_status


@blp.get("/identities")
def identity_page() -> ResponseReturnValue:
    workspace_id = _workspace()
    external_id = require_external_id(request.args.get("external_id"))
    full = _authorize(workspace_id, external_id)
    timeline = identity_timeline(services().app, workspace_id, external_id, full=full)
    found = services()
    ledger = identity_verification(found.app, found.database, found.settings, workspace_id,
                                   external_id)
    # Only a reader of the full history is offered the bundle (see proof_download).
    download = url_for(".proof_download", workspace=str(workspace_id),
                       external_id=external_id) if full else None
    return _render("audit/identity.html", 200, t=timeline, ledger=ledger, download=download)


@blp.get("/identities/proof")
def proof_download() -> Response:
    """The identity's proof bundle as a file, exactly what ``kandev-es-verify
    bundle`` reads (the JSON route's ``proof``, the CLI's ``--proof``). It
    carries the events' bytes as stored, unredacted (the verifier recomputes
    their hashes from them), so it never gives more than the full history the
    same reader gets from ``…/identities/history``: an audit link, which
    opens only the redacted page, is refused with 403 operator_required."""
    workspace_id = _workspace()
    external_id = require_external_id(request.args.get("external_id"))
    if not _authorize(workspace_id, external_id):
        raise OperatorRequired(
            "the proof bundle holds the events unredacted: it needs an admin token or an"
            " operator token of the workspace, not an audit link"
        )
    found = services()
    bundle = proof_bundle(found.app, found.database, workspace_id, external_id)
    response = Response(json.dumps(bundle, indent=2) + "\n", mimetype="application/json")
    # Named by the stream id: the external id is the caller's text, not a file name.
    response.headers["Content-Disposition"] = (
        f'attachment; filename="proof-{bundle["stream_id"]}.json"'
    )
    return response


@blp.errorhandler(KandevError)
def _error(error: KandevError) -> ResponseReturnValue:
    body = error.to_dict()
    message = error.message if "message" in body else ""
    status = http_status(error)
    return _render("audit/error.html", status, status=status, code=body["error"], message=message)


@blp.after_request
def _headers(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    # The page's URL may carry an audit link: never send it on as a Referer
    # (Cache-Control: no-store, as on every answer, comes from api/app.py).
    response.headers["Referrer-Policy"] = "no-referrer"
    return response
