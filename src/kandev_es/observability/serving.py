"""The request id and the other facts every log line of one request shares.

A context variable holds them while a request is served (set by the WSGI
middleware, an MCP tool call, or the Runtime working on a creation for the
request that claimed it); ``RequestFields`` copies them onto each log record.
"""

from __future__ import annotations

import contextlib
import logging
import re
import uuid
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from kandev_es.observability import tracing

HEADER = "X-Request-Id"
WSGI_HEADER = "HTTP_X_REQUEST_ID"
# A caller's id is kept when it is short and made of characters that are safe
# in a header, a log line, a URL and a shell: anything else gets a new id
# (a hostile id must not forge log lines or grow them without bound).
MAX_LENGTH = 128
_WELL_FORMED = re.compile(rf"[A-Za-z0-9._:\-]{{1,{MAX_LENGTH}}}")
# On a record: the fields a line of a request carries (the JSON keys too).
FIELDS = ("request_id", "trace_id", "workspace", "route", "status", "duration")


@dataclass
class Serving:
    """What is known of the request being served; filled in as it is learnt."""

    request_id: str
    route: str | None = None
    workspace: str | None = None


_serving: ContextVar[Serving | None] = ContextVar("kandev_serving", default=None)


def new_request_id() -> str:
    return uuid.uuid4().hex


def accepted(raw: str | None) -> str:
    """The caller's id if it is well formed, else a new one."""
    if raw and _WELL_FORMED.fullmatch(raw):
        return raw
    return new_request_id()


def current() -> Serving | None:
    return _serving.get()


def current_request_id() -> str | None:
    serving = _serving.get()
    return serving.request_id if serving is not None else None


def begin(request_id: str) -> Serving:
    """Start serving ``request_id`` in this context (ended by ``end``)."""
    serving = Serving(request_id)
    _serving.set(serving)
    return serving


def end() -> None:
    _serving.set(None)


@contextlib.contextmanager
def acting_for(request_id: str | None) -> Iterator[Serving | None]:
    """Work done for ``request_id`` (None: for no request) within the block;
    the context it replaced comes back after it."""
    token = _serving.set(Serving(request_id) if request_id else None)
    try:
        yield _serving.get()
    finally:
        _serving.reset(token)


def with_request_id(body: dict[str, Any]) -> dict[str, Any]:
    """An error body with the id of the request it answers (REST and MCP)."""
    request_id = current_request_id()
    return {**body, "request_id": request_id} if request_id else body


def note_workspace(workspace_id: object) -> None:
    """The workspace the request acts on, once known (its log lines say it)."""
    serving = _serving.get()
    if serving is not None and workspace_id is not None:
        serving.workspace = str(workspace_id)


class RequestFields(logging.Filter):
    """Puts the request's fields on every record a handler writes (None where
    unknown; a field given with ``extra=`` is kept)."""

    def filter(self, record: logging.LogRecord) -> bool:
        serving = _serving.get()
        values = {
            "request_id": serving.request_id if serving else None,
            "workspace": serving.workspace if serving else None,
            "route": serving.route if serving else None,
            "trace_id": tracing.current_trace_id(),
            "status": None,
            "duration": None,
        }
        for name, value in values.items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True

