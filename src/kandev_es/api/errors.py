"""Typed errors as HTTP responses: the status from the one table beside the
errors (kandev_es.errors.http_status), which the MCP adapter reports too
(mcp/errors.py); nothing below the adapters reads a status."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from flask import Flask, jsonify, request
from flask.typing import ResponseReturnValue
from marshmallow import Schema, fields
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from kandev_es.errors import KandevError, PayloadTooLarge, TaskNotCreated, http_status
from kandev_es.observability.serving import with_request_id
from kandev_es.services.auth import credential_problem

log = logging.getLogger("kandev_es.api")


class ApiErrorSchema(Schema):
    """Every error body (KandevError.to_dict), as OpenAPI publishes it."""

    error = fields.String(
        required=True,
        metadata={"description": "machine-readable code", "example": "validation_failed"},
    )
    message = fields.String(metadata={"example": "invalid create request"})
    details = fields.Dict(
        metadata={"example": {"fields": {"title": ["title must not be blank"]}}}
    )
    request_id = fields.String(
        metadata={
            "description": "the request's id, as in its X-Request-Id header and the logs",
            "example": "9f1c2b7e0d3a4c5b8e6f7a1b2c3d4e5f",
        }
    )


# What each error status means, as the OpenAPI document says it for every route
# that can answer it (``document_errors``); the body is always ApiErrorSchema.
ERROR_MEANINGS = {
    400: "bad request: a malformed id, query string, cursor, header or JSON body",
    403: "operator_required: a member token where the workspace's operator is needed",
    404: (
        "not found, or not yours: an unknown or revoked token, another workspace's "
        "resource and a missing one get the same answer (a refused create's message "
        "says whether no bearer token was sent, with WWW-Authenticate: Bearer, or it "
        "was malformed; else one text whether or not the workspace exists)"
    ),
    409: "conflict with the current state (the error code says which)",
    412: "revision_mismatch: If-Match names an older revision of the task",
    413: "payload_too_large: the body exceeds KANDEV_MAX_BODY_BYTES",
    422: "invalid body: details lists each field's problem",
    429: "too many: a run's or a workspace's agents are at their limit",
    502: "a required effect failed: the creation was aborted and compensated",
    503: "unavailable for now (store, schema attestation, stream slots): retry after Retry-After",
}


def document_errors(blp: Any, *codes: int) -> Callable[[Any], Any]:
    """Declare the error statuses a view can answer, each with its meaning and
    the one error body (OpenAPI only: the handlers below send them)."""

    def decorate(view: Any) -> Any:
        for code in codes:
            view = blp.alt_response(code, schema=ApiErrorSchema, description=ERROR_MEANINGS[code])(
                view
            )
        return view

    return decorate


# A refused create that carried no bearer token names the scheme it wants.
BEARER_CHALLENGE = 'Bearer realm="kandev-es"'


def _kandev_error(error: KandevError) -> ResponseReturnValue:
    status = http_status(error)
    challenge = False
    if isinstance(error, TaskNotCreated):
        error, challenge = _as_credential_refusal(error)
    response = jsonify(with_request_id(error.to_dict()))
    if status == 503:
        response.headers["Retry-After"] = "1"
    if challenge:
        response.headers["WWW-Authenticate"] = BEARER_CHALLENGE
    return response, status


def _as_credential_refusal(error: TaskNotCreated) -> tuple[TaskNotCreated, bool]:
    """A refused create whose own credential was missing, not a bearer token
    or malformed says so (services/auth.py: credential_problem), with a
    challenge when no bearer token was sent; any other keeps its one text."""
    problem = credential_problem(request.headers.get("Authorization"))
    if problem is None:
        return error, False
    message, token_sent = problem
    return TaskNotCreated(message), not token_sent


def _http_error(error: HTTPException) -> ResponseReturnValue:
    if isinstance(error, RequestEntityTooLarge):
        return _kandev_error(PayloadTooLarge("request body is too large"))
    body: dict[str, object] = {
        "error": (error.name or "error").lower().replace(" ", "_"),
        "message": error.description or "",
    }
    data = getattr(error, "data", None)
    if isinstance(data, dict) and "messages" in data:
        body["details"] = data["messages"]
    return jsonify(with_request_id(body)), error.code or 500


def _unexpected(error: Exception) -> ResponseReturnValue:
    log.exception("unhandled error")
    body = {"error": "internal_error", "message": "internal server error"}
    return jsonify(with_request_id(body)), 500


def register(app: Flask) -> None:
    app.register_error_handler(KandevError, _kandev_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected)
