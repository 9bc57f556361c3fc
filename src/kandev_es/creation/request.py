"""Request-specific validation of a create (protocol step 4). Runs only after
the identity lookup missed, so a Found answer never depends on it (AC-4)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from marshmallow import RAISE, Schema, ValidationError, fields, validate

from kandev_es.errors import ValidationFailed

# The fields read before the lookup (steps 1-3); the schema below ignores them.
PRE_LOOKUP_FIELDS = ("workspace_id", "external_id")


class _Title(fields.String):
    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> str:
        text = super()._deserialize(value, attr, data, **kwargs).strip()
        if not text:
            raise ValidationError("title must not be blank")
        return text


class CreateTaskRequestSchema(Schema):
    """The create body. ``workspace_id`` and ``external_id`` are parsed earlier,
    by the protocol itself; here they are only declared for the OpenAPI."""

    class Meta:
        unknown = RAISE

    workspace_id = fields.UUID(load_default=None, metadata={"description": "target workspace"})
    external_id = fields.String(
        load_default=None,
        allow_none=True,
        metadata={"description": "caller's stable identity for this task (<= 255 UTF-8 bytes)"},
    )
    # minLength is published only (OpenAPI, MCP); _Title rejects a blank title itself.
    title = _Title(required=True, validate=validate.Length(max=500), metadata={"minLength": 1})
    description = fields.String(load_default="", validate=validate.Length(max=100_000))
    workflow = fields.String(load_default="default", validate=validate.Length(min=1, max=100))
    workflow_step = fields.String(load_default=None, allow_none=True)
    repositories = fields.List(
        fields.String(validate=validate.Length(min=1, max=200)),
        load_default=list,
        validate=validate.Length(max=20),
    )
    attachments = fields.List(
        fields.String(validate=validate.Length(min=1, max=200)),
        load_default=list,
        validate=validate.Length(max=50),
    )
    start_agent = fields.Boolean(load_default=False)
    agent_profile = fields.String(load_default=None, allow_none=True)
    parent_id = fields.UUID(load_default=None, allow_none=True)


# One instance for every request: loading keeps no state on the schema, and
# building one per call cost about as much as a database round trip.
_SCHEMA = CreateTaskRequestSchema()


def load_create_request(body: Mapping[str, Any]) -> dict[str, Any]:
    try:
        loaded: dict[str, Any] = _SCHEMA.load(dict(body))
    except ValidationError as error:
        raise ValidationFailed("invalid create request", fields=error.messages) from None
    for name in PRE_LOOKUP_FIELDS:
        loaded.pop(name, None)
    return loaded
