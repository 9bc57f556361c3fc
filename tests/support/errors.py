"""Error bodies as a test compares them: each carries the id of the request it
answers (``request_id``, docs/observability.md), which differs every time."""

from __future__ import annotations

from typing import Any


def without_request_id(body: Any) -> Any:
    """``body`` less its ``request_id``, which must be there (a non-empty string)."""
    assert isinstance(body, dict), body
    request_id = body.get("request_id")
    assert isinstance(request_id, str) and request_id, body
    return {key: value for key, value in body.items() if key != "request_id"}
