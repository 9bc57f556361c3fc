"""The ASGI counterpart of middleware.py, in front of `kandev-es mcp --http`
(mcp_http.py): each request gets its id (the caller's well-formed
``X-Request-Id``, else a new one), which the app sees in its scope and every
answer carries; each answer is counted (``on_answer``: /metrics) when its
headers go out, and its access line is written once it has been sent.

The HTTP front's own refusals (a head over a bound, a malformed or too slow
request: mcp_http.FrontProtocol) come through here too, as a scope carrying
the typed error under ``extensions[REFUSAL]``: answered here in the API's
error shape without calling the app, so they keep the caller's id, are logged
and counted like any answer."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kandev_es.errors import KandevError, http_status
from kandev_es.observability import serving, tracing
from kandev_es.observability.middleware import OnAnswer, access_line

REFUSAL = "kandev.refusal"
_ID = serving.HEADER.lower().encode()
log = logging.getLogger("kandev_es.asgi")


def caller_id(scope: Scope) -> str | None:
    """The request's X-Request-Id header as sent (the first one), or None."""
    for name, value in scope.get("headers", []):
        if name.lower() == _ID:
            return bytes(value).decode("latin-1")
    return None


def with_request_id(scope: Scope, request_id: str) -> Scope:
    """The request as the app sees it: its X-Request-Id is ``request_id``."""
    headers = [h for h in scope.get("headers", []) if h[0].lower() != _ID]
    return {**scope, "headers": [*headers, (_ID, request_id.encode())]}


async def answer_error(
    error: KandevError,
    send: Send,
    close: bool = False,
    extra: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """``error`` in the API's error shape (as api/errors.py answers), with
    ``extra`` headers and ``Connection: close`` when the request is not read
    to its end."""
    body = json.dumps(serving.with_request_id(error.to_dict())).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    headers.extend(extra)
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": http_status(error), "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _environ(scope: Scope) -> dict[str, Any]:
    """What the access line shows of the request, as middleware.access_line reads it."""
    target = bytes(scope.get("raw_path") or scope.get("path", "").encode())
    if scope.get("query_string"):
        target += b"?" + bytes(scope["query_string"])
    client = scope.get("client")
    return {
        "REMOTE_ADDR": client[0] if client else "-",
        "REQUEST_METHOD": scope.get("method", "-"),
        "RAW_URI": target.decode("latin-1"),
        "SERVER_PROTOCOL": f"HTTP/{scope['http_version']}" if scope.get("http_version") else "-",
    }


class _Answer:
    """What went out: the status (0 until the headers did), bytes, trace id."""

    def __init__(self) -> None:
        self.status = 0
        self.sent = 0
        self.trace_id: str | None = None


def with_request_ids(
    app: ASGIApp, on_answer: OnAnswer | None = None, routes: frozenset[str] = frozenset()
) -> ASGIApp:
    """``app`` answering with ``X-Request-Id``, counted by ``on_answer`` (route:
    the request's path when it is one of ``routes``, else None) and logged by
    its access line; a refusal of the front answered here."""

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan: the app's own startup and shutdown
            await app(scope, receive, send)
            return
        started = time.perf_counter()
        current = serving.begin(serving.accepted(caller_id(scope)))
        refused = REFUSAL in scope.get("extensions", {})  # counted unmatched, as `serve` does
        current.route = scope.get("path") if scope.get("path") in routes and not refused else None
        scope = with_request_id(scope, current.request_id)
        answer = _Answer()
        sending = _counted(send, scope, answer, on_answer, started)
        try:
            await _serve(app, scope, receive, sending, answer)
        finally:
            try:
                fields = {"status": str(answer.status), "trace_id": answer.trace_id}
                access_line(_environ(scope), fields, answer.sent, time.perf_counter() - started)
            finally:
                serving.end()

    return serve


def _counted(
    send: Send, scope: Scope, answer: _Answer, on_answer: OnAnswer | None, started: float
) -> Send:
    """``send`` adding the request's id to the answer's headers, counting the
    answer when they go out and its body's bytes."""
    current = serving.current()
    request_id = current.request_id.encode() if current else b""
    route = current.route if current else None

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            answer.status = int(message["status"])
            answer.trace_id = tracing.current_trace_id()
            headers = [h for h in message.get("headers", []) if h[0].lower() != _ID]
            message = {**message, "headers": [*headers, (_ID, request_id)]}
            if on_answer is not None:
                seconds = time.perf_counter() - started
                on_answer(str(scope.get("method", "")), route, answer.status, seconds)
        elif message["type"] == "http.response.body":
            answer.sent += len(message.get("body", b""))
        await send(message)

    return sending


async def _serve(app: ASGIApp, scope: Scope, receive: Receive, send: Send, answer: _Answer) -> None:
    """The app's answer, or the front's refusal; an error the app raises
    before answering is a 500 in the API's shape (uvicorn's own would carry
    no id and go uncounted)."""
    refusal = scope.get("extensions", {}).get(REFUSAL)
    if refusal is not None:
        await answer_error(refusal, send, close=True)
        return
    try:
        await app(scope, receive, send)
    except Exception:
        if answer.status:
            raise
        log.exception("unexpected error answering %s %s", scope.get("method"), scope.get("path"))
        await answer_error(KandevError("internal server error"), send, close=True)
