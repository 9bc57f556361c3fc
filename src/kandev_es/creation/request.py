"""Request-specific validation of a create (protocol step 4). Runs only after
the identity lookup missed, so a Found answer never depends on it (AC-4)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from marshmallow import RAISE, Schema, ValidationError, fields, missing, validate

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
    loaded = _plain_load(body)
    if loaded is None:
        try:
            loaded = _SCHEMA.load(dict(body))
        except ValidationError as error:
            raise ValidationFailed("invalid create request", fields=error.messages) from None
    for name in PRE_LOOKUP_FIELDS:
        loaded.pop(name, None)
    return loaded


# The schema's fields as plain rules (name, kind, required, allow_none,
# load_default, length bounds of the value and of a list's items), so that a
# body marshmallow would accept unchanged is loaded in one loop: marshmallow's
# own load is about a twentieth of a Created's Python calls. Anything a rule
# does not cover exactly -- another field type, validator or hook, an unknown
# key, a value of another type, any value out of bounds -- goes to
# marshmallow, which loads or refuses it as always.
# tests/unit/test_create_request_loading.py compares the two.
_Bounds = tuple[int | None, int | None]
_Rule = tuple[str, str, bool, bool, Any, _Bounds, _Bounds]
_KINDS: dict[type[Any], str] = {
    fields.String: "str",
    _Title: "title",
    fields.UUID: "uuid",
    fields.Boolean: "bool",
    fields.List: "list",
}


def _bounds(field: fields.Field[Any]) -> _Bounds | None:
    """(min, max) of the field's one Length validator, (None, None) without
    one; None for any other validator."""
    if len(field.validators) > 1:
        return None
    if not field.validators:
        return (None, None)
    only = field.validators[0]
    if type(only) is not validate.Length or only.equal is not None:
        return None
    return (only.min, only.max)


def _plain(field: fields.Field[Any]) -> bool:
    return (
        field.data_key is None
        and field.attribute is None
        and not field.pre_load
        and not field.post_load
    )


def _plain_rules(schema: Schema) -> tuple[_Rule, ...] | None:
    if any(schema._hooks.values()):
        return None
    rules: list[_Rule] = []
    for name, field in schema.load_fields.items():
        kind = _KINDS.get(type(field))
        bounds = _bounds(field)
        if kind is None or bounds is None or not _plain(field):
            return None
        items: _Bounds | None = (None, None)
        if isinstance(field, fields.List):
            inner = field.inner
            items = _bounds(inner)
            if type(inner) is not fields.String or inner.allow_none or not _plain(inner):
                return None
        if items is None:
            return None
        rules.append(
            (name, kind, field.required, field.allow_none, field.load_default, bounds, items)
        )
    return tuple(rules)


def _within(size: int, bounds: _Bounds) -> bool:
    low, high = bounds
    return (low is None or size >= low) and (high is None or size <= high)


_RULES = _plain_rules(_SCHEMA)
_NAMES = frozenset(rule[0] for rule in _RULES or ())


def _plain_load(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """What ``_SCHEMA.load(body)`` returns, key order included, for a body it
    would load without changing a value's type (a title is stripped); None
    for anything else."""
    if _RULES is None or not body.keys() <= _NAMES:
        return None
    loaded: dict[str, Any] = {}
    for name, kind, required, allow_none, default, bounds, items in _RULES:
        value = body.get(name, missing)
        if value is missing:
            if required:
                return None
            if default is not missing:
                loaded[name] = default() if callable(default) else default
            continue
        if value is None:
            if not allow_none:
                return None
            loaded[name] = None
            continue
        if kind == "str" or kind == "title":
            if type(value) is not str:
                return None
            if kind == "title":
                value = value.strip()
                if not value:
                    return None
            if not _within(len(value), bounds):
                return None
        elif kind == "uuid":
            if type(value) is not str:
                return None
            try:
                value = uuid.UUID(value)
            except ValueError:
                return None
        elif kind == "bool":
            if type(value) is not bool:
                return None
        else:  # a list of strings
            if type(value) is not list or not _within(len(value), bounds):
                return None
            if any(type(item) is not str or not _within(len(item), items) for item in value):
                return None
            value = list(value)
        loaded[name] = value
    return loaded
