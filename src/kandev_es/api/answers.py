"""The create route's 200 answer, built as flask-smorest would build it (dumped
through ``CreateTaskResponseSchema``, then ``jsonify``), and for a Found built
once per task snapshot: a retry storm answers the same bytes without dumping
the same task through marshmallow again for every caller."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from flask import Response, current_app, jsonify
from marshmallow import Schema, fields, missing

from kandev_es.creation.outcomes import CreateResult, CreateTaskResponseSchema

ANSWERS_KEY = "kandev_es.create_answers"
ANSWER_CACHE_SIZE = 4096
_SCHEMA = CreateTaskResponseSchema()


def create_answer(result: CreateResult) -> Response:
    if result.handle is not None:  # a Created: its own private handle, never shared
        return _built(result)
    # A Found's task DTO is shared and read-only, one object per task snapshot
    # (CreationService._dto), so that object and the outcome decide the body.
    # Kept per application: its JSON settings decide the bytes.
    bodies: dict[tuple[int, str], tuple[Mapping[str, Any], bytes, str]]
    bodies = current_app.extensions.setdefault(ANSWERS_KEY, {})
    key = (id(result.task), result.outcome.value)
    cached = bodies.get(key)
    if cached is not None and cached[0] is result.task:
        return current_app.response_class(cached[1], mimetype=cached[2])
    built = _built(result)
    if len(bodies) >= ANSWER_CACHE_SIZE:
        bodies.clear()
    # Holding the DTO keeps its id from being reused while the entry lives.
    bodies[key] = (result.task, built.get_data(), built.mimetype or "application/json")
    return built


def _built(result: CreateResult) -> Response:
    return jsonify(dump(result.to_response()))


# The value types each plain field's dump returns unchanged (marshmallow 4:
# String -> str, UUID -> str(value), Boolean, Integer -> int(value), List ->
# its inner field per item; None -> None for all of them).
_UNCHANGED: dict[type[fields.Field[Any]], type] = {
    fields.String: str,
    fields.UUID: str,
    fields.Boolean: bool,
    fields.Integer: int,
}


def _plain_kinds(schema: Schema) -> dict[str, tuple[type, type | None]] | None:
    """{field name: (value type, item type for a list)} when every field of
    ``schema`` is a plain one whose dump leaves such values as they are; None
    (always dump with marshmallow) if any field or hook could change them."""
    if any(schema._hooks.values()):
        return None
    kinds: dict[str, tuple[type, type | None]] = {}
    for name, field in schema.dump_fields.items():
        if field.data_key is not None or field.attribute is not None:
            return None
        if field.dump_default is not missing:
            return None
        if type(field) is fields.List:
            inner = _UNCHANGED.get(type(field.inner))
            if inner is None:
                return None
            kinds[name] = (list, inner)
        elif type(field) in _UNCHANGED:
            kinds[name] = (_UNCHANGED[type(field)], None)
        else:
            return None
    return kinds


_KINDS = _plain_kinds(_SCHEMA)


def dump(body: Mapping[str, Any]) -> dict[str, Any]:
    """What ``CreateTaskResponseSchema().dump(body)`` returns, key order
    included. A task DTO (views.task_dto) plus the outcome fields already holds
    exactly what the schema's fields would make of it, so it is copied field by
    field; any other value goes through marshmallow itself."""
    if _KINDS is None:
        return dict(_SCHEMA.dump(body))
    dumped: dict[str, Any] = {}
    for name, (kind, item) in _KINDS.items():
        value: Any = body.get(name, missing)
        if value is missing:
            continue
        if value is not None and (
            type(value) is not kind
            or (item is not None and any(type(each) is not item for each in cast(list[Any], value)))
        ):
            return dict(_SCHEMA.dump(body))
        dumped[name] = value if item is None or value is None else list(cast(list[Any], value))
    return dumped
