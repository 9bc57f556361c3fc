"""The one mapping from typed errors to HTTP statuses and responses. The MCP
adapter reports the same status (mcp/errors.py); nothing below the adapters
knows any status."""

from __future__ import annotations

import logging

from flask import Flask, jsonify
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from kandev_es.errors import (
    BadRequest,
    Conflict,
    EffectFailed,
    KandevError,
    NotFound,
    OperatorRequired,
    PayloadTooLarge,
    RevisionMismatch,
    Unauthenticated,
    Unavailable,
    ValidationFailed,
)

log = logging.getLogger("kandev_es.api")

# By family: a class answers with the status of its nearest listed ancestor.
HTTP_STATUS: dict[type[KandevError], int] = {
    BadRequest: 400,
    Unauthenticated: 401,
    OperatorRequired: 403,
    NotFound: 404,
    Conflict: 409,
    RevisionMismatch: 412,
    PayloadTooLarge: 413,
    ValidationFailed: 422,
    EffectFailed: 502,
    Unavailable: 503,
}


def http_status(error: KandevError | type[KandevError]) -> int:
    """The HTTP status of a typed error (or of its class); 500 for one of no
    listed family (InvalidSetting, which only the CLI reports)."""
    for family in (error if isinstance(error, type) else type(error)).__mro__:
        if family in HTTP_STATUS:
            return HTTP_STATUS[family]
    return 500


def _kandev_error(error: KandevError) -> ResponseReturnValue:
    status = http_status(error)
    response = jsonify(error.to_dict())
    if status == 503:
        response.headers["Retry-After"] = "1"
    return response, status


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
    return jsonify(body), error.code or 500


def _unexpected(error: Exception) -> ResponseReturnValue:
    log.exception("unhandled error")
    return jsonify({"error": "internal_error", "message": "internal server error"}), 500


def register(app: Flask) -> None:
    app.register_error_handler(KandevError, _kandev_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected)
