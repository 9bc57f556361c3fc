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

    workspace_id = fields.UUID(
        load_default=None,
        metadata={
            "description": "target workspace",
            "example": "7fc25427-7f8a-5abf-9d5e-8f212c56c7f1",
        },
    )
    external_id = fields.String(
        load_default=None,
        allow_none=True,
        metadata={
            "description": "caller's stable identity for this task (<= 255 UTF-8 bytes)",
            "example": "JIRA-1",
        },
    )
    # minLength is published only (OpenAPI, MCP); _Title rejects a blank title itself.
    title = _Title(
        required=True,
        validate=validate.Length(max=500),
        metadata={"minLength": 1, "example": "First task"},
    )
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
_BY_NAME = {rule[0]: rule for rule in _RULES or ()}
# What an empty body loads to, in the schema's order: each field's default
# (a factory, for a fresh list, called per load), ``missing`` for a required
# one. A body then only overwrites its own fields, which keep their place:
# the loop runs over the few fields a body has, not every rule. Only when
# every field is required or has a default (else an absent field would be
# left out, a present one put last).
_TEMPLATE: dict[str, Any] | None = (
    {name: missing if required else default for name, _, required, _, default, _, _ in _RULES}
    if _RULES is not None and all(rule[2] or rule[4] is not missing for rule in _RULES)
    else None
)
_REQUIRED = tuple(rule[0] for rule in _RULES or () if rule[2])
_FACTORIES = tuple(rule[0] for rule in _RULES or () if not rule[2] and callable(rule[4]))


def _plain_load(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """What ``_SCHEMA.load(body)`` returns, key order included, for a body it
    would load without changing a value's type (a title is stripped); None
    for anything else."""
    if _TEMPLATE is None or not body.keys() <= _NAMES:
        return None
    loaded = dict(_TEMPLATE)
    for name, value in body.items():
        _, kind, _, allow_none, _, bounds, items = _BY_NAME[name]
        if value is None:
            if not allow_none:
                return None
            loaded[name] = None
            continue
        value = _plain_value(kind, value, bounds, items)
        if value is missing:
            return None
        loaded[name] = value
    for name in _REQUIRED:
        if loaded[name] is missing:
            return None
    for name in _FACTORIES:
        if name not in body:
            loaded[name] = loaded[name]()
    return loaded


def _plain_value(kind: str, value: Any, bounds: _Bounds, items: _Bounds) -> Any:
    """A present, non-null value as the schema loads it; ``missing`` for one
    the plain rules do not cover."""
    if kind == "str" or kind == "title":
        if type(value) is not str:
            return missing
        if kind == "title":
            value = value.strip()
            if not value:
                return missing
        return value if _within(len(value), bounds) else missing
    if kind == "uuid":
        if type(value) is not str:
            return missing
        try:
            return uuid.UUID(value)
        except ValueError:
            return missing
    if kind == "bool":
        return value if type(value) is bool else missing
    # a list of strings
    if type(value) is not list or not _within(len(value), bounds):
        return missing
    if any(type(item) is not str or not _within(len(item), items) for item in value):
        return missing
    return list(value)
