"""The create route's 200 answer, built as flask-smorest would build it (dumped
through ``CreateTaskResponseSchema``, then ``jsonify``), and for a Found built
once per task snapshot: a retry storm answers the same bytes without dumping
the same task through marshmallow again for every caller."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flask import Response, current_app, jsonify

from kandev_es.api.schemas import CreateTaskResponseSchema
from kandev_es.creation.outcomes import CreateResult

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
    return jsonify(_SCHEMA.dump(result.to_response()))
