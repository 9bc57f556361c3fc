"""Webhook subscriptions of a workspace (an operator of it, or an admin):
create, list, get, pause, resume, delete, rotate the secret, replay from a
feed position, the delivery log; and the server's v1a public key."""

from __future__ import annotations

import uuid
from typing import Any

from flask import request
from flask.views import MethodView
from flask_smorest import Blueprint
from marshmallow import Schema, fields

from kandev_es.api.context import json_object, path_uuid, principal, services
from kandev_es.api.errors import document_errors
from kandev_es.domain.principal import require_operator
from kandev_es.errors import BadRequest, WorkspaceNotFound
from kandev_es.limits import parse_bounded
from kandev_es.webhooks.subscriptions import MAX_LOG, WebhookService

blp = Blueprint("webhooks", __name__, url_prefix="/api/v1", description="Webhooks")


class WebhookCreateSchema(Schema):
    url = fields.String(
        required=True,
        metadata={
            "description": "https (http only with KANDEV_WEBHOOK_ALLOW_HTTP); a public"
            " address unless in KANDEV_WEBHOOK_ALLOW_NETWORKS"
        },
    )
    event_types = fields.List(
        fields.String(),
        required=True,
        metadata={"description": "task.created and/or task.updated"},
    )
    description = fields.String(load_default="")
    after = fields.Integer(
        metadata={"description": "feed position to start after (default: the feed's head)"}
    )


class WebhookSchema(Schema):
    id = fields.UUID(required=True)
    workspace_id = fields.UUID(required=True)
    url = fields.String(required=True)
    event_types = fields.List(fields.String(), required=True)
    description = fields.String(required=True)
    state = fields.String(required=True, metadata={"description": "active, paused or disabled"})
    disabled_reason = fields.String(allow_none=True, required=True)
    cursor = fields.Integer(
        required=True, metadata={"description": "feed position of the last event acknowledged"}
    )
    attempts = fields.Integer(
        required=True, metadata={"description": "failed attempts of the next event"}
    )
    next_attempt_at = fields.String(allow_none=True, required=True)
    previous_secret_expires_at = fields.String(
        allow_none=True,
        required=True,
        metadata={"description": "while a rotated-out secret still signs: until when"},
    )
    created_at = fields.String(required=True)
    updated_at = fields.String(required=True)


class WebhookSecretSchema(WebhookSchema):
    secret = fields.String(
        required=True, metadata={"description": "whsec_...: shown once, for v1 signatures"}
    )


class WebhookListSchema(Schema):
    items = fields.List(fields.Nested(WebhookSchema), required=True)


class ReplaySchema(Schema):
    after = fields.Integer(
        required=True, metadata={"description": "feed cursor: deliver every event after it"}
    )


class RotateSchema(Schema):
    overlap_seconds = fields.Float(
        metadata={"description": "how long the old secret keeps signing (default 86400)"}
    )


class AttemptSchema(Schema):
    position = fields.Integer(required=True)
    webhook_id = fields.UUID(required=True)
    attempt = fields.Integer(required=True)
    at = fields.String(required=True)
    result = fields.String(
        required=True, metadata={"description": "delivered, failed, no_answer or gone"}
    )
    status = fields.Integer(allow_none=True, required=True)
    latency_ms = fields.Float(required=True)
    response = fields.String(
        required=True, metadata={"description": "the answer's first characters, redacted"}
    )
    next_attempt_at = fields.String(allow_none=True, required=True)
    request_id = fields.String(required=True)


class DeliveriesSchema(Schema):
    subscription = fields.Nested(WebhookSchema, required=True)
    items = fields.List(fields.Nested(AttemptSchema), required=True)


class KeyringKeySchema(Schema):
    public_key = fields.String(required=True, metadata={"description": "whpk_..."})
    until = fields.String(
        allow_none=True,
        required=True,
        metadata={"description": "when it stops signing (a rotated-out key); null: current"},
    )


class PublicKeySchema(Schema):
    public_key = fields.String(
        required=True, metadata={"description": "whpk_...: the current key, signs v1a"}
    )
    keys = fields.List(
        fields.Nested(KeyringKeySchema),
        required=True,
        metadata={
            "description": "every key that signs now: after a key rotation the old one"
            " signs beside the new one until its overlap ends (a v1a entry each)"
        },
    )


def _operated(workspace_id: str) -> uuid.UUID:
    target = path_uuid(workspace_id, "workspace id")
    if services().workspaces.get(target) is None:
        raise WorkspaceNotFound("workspace not found")
    require_operator(principal(), target, needing="webhooks")
    return target


def _service() -> WebhookService:
    return services().webhooks.service


def _body(schema: type[Schema], required: bool = True) -> dict[str, Any]:
    return {
        "requestBody": {"required": required, "content": {"application/json": {"schema": schema}}}
    }


@blp.route("/workspaces/<workspace_id>/webhooks")
class WebhookCollection(MethodView):
    @blp.response(200, WebhookListSchema)
    @document_errors(blp, 400, 403, 404)
    def get(self, workspace_id: str) -> dict[str, Any]:
        """List the workspace's webhook subscriptions (operator)

        Each with its URL, event types, state (and why it was disabled), its
        cursor on the feed and the failed attempts of its next event; never a
        secret.
        """
        return {"items": _service().list(_operated(workspace_id))}

    @blp.doc(**_body(WebhookCreateSchema))
    @blp.response(201, WebhookSecretSchema)
    @document_errors(blp, 400, 403, 404, 409, 413, 422)
    def post(self, workspace_id: str) -> dict[str, Any]:
        """Subscribe a URL to the workspace's feed (operator)

        Every feed event of the chosen types is POSTed to `url` in feed order,
        signed by the Standard Webhooks rules (`webhook-id` is the feed event's
        id). The answer carries the secret (`whsec_…`) this once.
        """
        target = _operated(workspace_id)
        body = json_object()
        dto, secret = _service().create(
            target,
            body.get("url"),
            body.get("event_types"),
            body.get("description", ""),
            body.get("after"),
        )
        return {**dto, "secret": secret}


@blp.route("/workspaces/<workspace_id>/webhooks/<webhook_id>")
class WebhookItem(MethodView):
    @blp.response(200, WebhookSchema)
    @document_errors(blp, 400, 403, 404)
    def get(self, workspace_id: str, webhook_id: str) -> dict[str, Any]:
        """Get a webhook subscription (operator)

        Where it stands: state, `disabled_reason`, `cursor`, `attempts` and
        `next_attempt_at`; never its secret.
        """
        return _service().get(_operated(workspace_id), path_uuid(webhook_id, "webhook id"))

    @blp.response(200, WebhookSchema)
    @document_errors(blp, 400, 403, 404)
    def delete(self, workspace_id: str, webhook_id: str) -> dict[str, Any]:
        """Delete a webhook subscription (operator)

        Nothing more is delivered to it; its secret and its delivery log go with it.
        """
        return _service().delete(_operated(workspace_id), path_uuid(webhook_id, "webhook id"))


def _act(name: str, doc: str) -> None:
    """POST …/webhooks/<id>/<name>: the service's method of that name."""

    def post(self: Any, workspace_id: str, webhook_id: str) -> dict[str, Any]:
        target = _operated(workspace_id)
        found: dict[str, Any] = getattr(_service(), name)(
            target, path_uuid(webhook_id, "webhook id")
        )
        return found

    post.__doc__ = doc
    view = type(
        f"Webhook_{name}",
        (MethodView,),
        {"post": blp.response(200, WebhookSchema)(document_errors(blp, 400, 403, 404)(post))},
    )
    blp.route(f"/workspaces/<workspace_id>/webhooks/<webhook_id>/{name}")(view)


_act(
    "pause",
    "Pause a webhook subscription (operator)\n\nNo delivery until resumed; its cursor stays.",
)
_act(
    "resume",
    "Resume or re-enable a webhook subscription (operator)\n\nDelivers again"
    " from its cursor at once; a disabled one's reason and attempts are cleared.",
)


@blp.route("/workspaces/<workspace_id>/webhooks/<webhook_id>/replay")
class WebhookReplay(MethodView):
    @blp.doc(**_body(ReplaySchema))
    @blp.response(200, WebhookSchema)
    @document_errors(blp, 400, 403, 404, 409, 413, 422)
    def post(self, workspace_id: str, webhook_id: str) -> dict[str, Any]:
        """Replay from a feed position (operator)

        Every event after `after` (a cursor of the JSON feed or SSE) is delivered
        again, in order, with its own `webhook-id`. 409 `webhook_paused` for a
        paused subscription; a disabled one stays disabled until resumed.
        """
        target = _operated(workspace_id)
        return _service().replay(
            target, path_uuid(webhook_id, "webhook id"), json_object().get("after")
        )


@blp.route("/workspaces/<workspace_id>/webhooks/<webhook_id>/rotate-secret")
class WebhookRotate(MethodView):
    @blp.doc(**_body(RotateSchema, required=False))
    @blp.response(200, WebhookSecretSchema)
    @document_errors(blp, 400, 403, 404, 413, 422)
    def post(self, workspace_id: str, webhook_id: str) -> dict[str, Any]:
        """Rotate the secret (operator)

        The new secret is shown this once; the old one keeps signing beside it
        (a second `v1` signature) for `overlap_seconds` (default 24 h).
        """
        target = _operated(workspace_id)
        overlap = json_object().get("overlap_seconds") if request.get_data() else None
        if overlap is not None and not isinstance(overlap, int | float):
            raise BadRequest("overlap_seconds must be a number")
        dto, secret = _service().rotate_secret(target, path_uuid(webhook_id, "webhook id"), overlap)
        return {**dto, "secret": secret}


@blp.route("/workspaces/<workspace_id>/webhooks/<webhook_id>/deliveries")
class WebhookDeliveries(MethodView):
    @blp.doc(
        parameters=[
            {
                "name": "limit",
                "in": "query",
                "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LOG},
                "description": "how many attempts, newest first (default 20)",
            }
        ]
    )
    @blp.response(200, DeliveriesSchema)
    @document_errors(blp, 400, 403, 404)
    def get(self, workspace_id: str, webhook_id: str) -> dict[str, Any]:
        """The delivery log of a subscription (operator)

        The latest attempts, newest first: feed position, `webhook_id`, attempt,
        result, status, latency, the answer's first characters (redacted), the next
        attempt and the request id it was sent with; then the subscription.
        """
        target = _operated(workspace_id)
        limit = int(parse_bounded(request.args.get("limit"), "limit", 20, 1, MAX_LOG))
        return _service().deliveries(target, path_uuid(webhook_id, "webhook id"), limit)


@blp.route("/webhooks/public-key")
class WebhookPublicKey(MethodView):
    @blp.response(200, PublicKeySchema)
    @document_errors(blp, 404)
    def get(self) -> dict[str, Any]:
        """The server's v1a public keyring (any token)

        Verifies the `v1a` (Ed25519) entries of every webhook's `webhook-signature`:
        accept a webhook when one of them verifies with one of `keys`. After a key
        rotation the old key signs beside the new one until its overlap ends.
        """
        if principal() is None:
            raise WorkspaceNotFound("workspace not found")
        hooks = services().webhooks
        return {"public_key": hooks.public_key(), "keys": hooks.keyring()}
