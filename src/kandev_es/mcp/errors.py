"""The one mapping from typed errors to MCP tool results.

A failure is a tool result with ``isError: true`` whose structured content is
the REST error body (with the call's ``request_id``) plus its HTTP ``status``
(``kandev_es.errors.http_status``, the one table REST answers with too):
callers branch on the same
machine-readable ``error`` code over REST and MCP."""

from __future__ import annotations

import json
import logging
from typing import Any

from mcp_types import CallToolResult, TextContent

from kandev_es.errors import KandevError, http_status
from kandev_es.observability.serving import with_request_id

log = logging.getLogger("kandev_es.mcp")


def success(body: dict[str, Any]) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(body, default=str))],
        structured_content=body,
    )


def failure(error: KandevError) -> CallToolResult:
    body = error.to_dict() | {"status": http_status(error)}
    return _error_result(body)


def unexpected(error: BaseException) -> CallToolResult:
    log.error("unhandled error in MCP tool", exc_info=error)
    return _error_result(
        {"error": "internal_error", "message": "internal server error", "status": 500}
    )


def _error_result(body: dict[str, Any]) -> CallToolResult:
    body = with_request_id(body)
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(body, default=str))],
        structured_content=body,
        is_error=True,
    )
