"""Typed errors as HTTP responses: the status from the one table beside the
errors (kandev_es.errors.http_status), which the MCP adapter reports too
(mcp/errors.py); nothing below the adapters reads a status."""

from __future__ import annotations

import logging

from flask import Flask, jsonify
from flask.typing import ResponseReturnValue
from marshmallow import Schema, fields
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from kandev_es.errors import KandevError, PayloadTooLarge, http_status
from kandev_es.observability.serving import with_request_id

log = logging.getLogger("kandev_es.api")


class ApiErrorSchema(Schema):
    """Every error body (KandevError.to_dict), as OpenAPI publishes it."""

    error = fields.String(required=True, metadata={"description": "machine-readable code"})
    message = fields.String()
    details = fields.Dict()
    request_id = fields.String(
        metadata={"description": "the request's id, as in its X-Request-Id header and the logs"}
    )


def _kandev_error(error: KandevError) -> ResponseReturnValue:
    status = http_status(error)
    response = jsonify(with_request_id(error.to_dict()))
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
    return jsonify(with_request_id(body)), error.code or 500


def _unexpected(error: Exception) -> ResponseReturnValue:
    log.exception("unhandled error")
    body = {"error": "internal_error", "message": "internal server error"}
    return jsonify(with_request_id(body)), 500


def register(app: Flask) -> None:
    app.register_error_handler(KandevError, _kandev_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected)
