"""The WSGI layer in front of the app, whatever server runs it, and the one
path every answer takes: each request gets its id (``serving.accepted``: the
caller's ``X-Request-Id`` when well formed), every answer carries it in
``X-Request-Id``, is counted (``on_answer``: /metrics) when its headers go
out, and once it has been sent its access line is written (logger
``kandev_es.access``: method, path and query, status, bytes, seconds;
redacted like every line).

The HTTP front's own refusals (a head or body over a bound, a malformed or
too slow request: http_limits.py) come through here too, as an environ
carrying the typed error under ``REFUSAL_KEY``: this layer answers them in the
API's error shape without calling the app, so they keep the caller's id, are
logged and counted like any answer."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from http import HTTPStatus
from typing import Any
from urllib.parse import quote

from kandev_es.errors import KandevError, http_status
from kandev_es.observability import serving, tracing
from kandev_es.observability.logs import ACCESS_LOGGER

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
# Called once per answer when its headers go out: method, URL rule (None when no
# route matched), status, seconds since the request reached this layer.
OnAnswer = Callable[[str, str | None, int, float], None]
ENVIRON_KEY = "kandev.request_id"
# The typed error the HTTP front refused a request with (http_limits.py).
REFUSAL_KEY = "kandev.refusal"
log = logging.getLogger(ACCESS_LOGGER)


class _Answer:
    """The response body, passed through; at its close, the access line and
    the end of the request's context."""

    def __init__(self, body: Iterable[bytes], done: Callable[[int], None]) -> None:
        self.body = body
        self.done = done

    def __iter__(self) -> Iterator[bytes]:
        sent = 0
        try:
            for chunk in self.body:
                sent += len(chunk)
                yield chunk
        finally:
            self.sent = sent

    sent = 0

    def close(self) -> None:
        try:
            close = getattr(self.body, "close", None)
            if close is not None:
                close()
        finally:
            self.done(self.sent)


def _target(environ: dict[str, Any]) -> str:
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if raw:
        return str(raw)
    path = quote(str(environ.get("SCRIPT_NAME", "")) + str(environ.get("PATH_INFO", "")))
    query = environ.get("QUERY_STRING")
    return f"{path}?{query}" if query else path


def with_request_ids(app: WSGIApp, on_answer: OnAnswer | None = None) -> WSGIApp:
    """``app`` answering with ``X-Request-Id``, counted by ``on_answer`` and
    logged by its access line; a refusal of the front answered here."""

    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        started = time.perf_counter()
        current = serving.begin(serving.accepted(environ.get(serving.WSGI_HEADER)))
        environ[ENVIRON_KEY] = current.request_id
        answer: dict[str, Any] = {"status": "500", "trace_id": None}

        def start(status: str, headers: list[tuple[str, str]], *exc: Any) -> Any:
            answer["status"] = status.split(" ", 1)[0]
            answer["trace_id"] = tracing.current_trace_id()  # the request's span is current
            headers = [h for h in headers if h[0].lower() != "x-request-id"]
            headers.append((serving.HEADER, current.request_id))
            if on_answer is not None:
                code = int(answer["status"]) if answer["status"].isdigit() else 0
                method = str(environ.get("REQUEST_METHOD", ""))
                on_answer(method, current.route, code, time.perf_counter() - started)
            return start_response(status, headers, *exc)

        def done(sent: int) -> None:
            try:
                access_line(environ, answer, sent, time.perf_counter() - started)
            finally:
                serving.end()

        refusal = environ.get(REFUSAL_KEY)
        try:
            body = app(environ, start) if refusal is None else _refuse(refusal, start)
        except BaseException:
            serving.end()
            raise
        return _Answer(body, done)

    return serve


def _refuse(error: KandevError, start: Callable[..., Any]) -> list[bytes]:
    """The front's refusal in the API's error shape (as api/errors.py answers)."""
    body = json.dumps(serving.with_request_id(error.to_dict())).encode()
    status = http_status(error)
    start(
        f"{status} {HTTPStatus(status).phrase}",
        [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
    )
    return [body]


def access_line(
    environ: dict[str, Any],
    answer: dict[str, Any],
    sent: int,
    seconds: float,
) -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    status = int(answer["status"]) if str(answer["status"]).isdigit() else 0
    # Made and handed to the handlers directly: Logger.info would also walk
    # the stack for the caller's file and line, which no access line shows
    # (a few µs on every request).
    record = log.makeRecord(
        log.name,
        logging.INFO,
        __file__,
        0,
        '%s "%s %s %s" %s %s %.3fs',
        (
            environ.get("REMOTE_ADDR", "-"),
            environ.get("REQUEST_METHOD", "-"),
            _target(environ),
            environ.get("SERVER_PROTOCOL", "-"),
            status,
            sent,
            seconds,
        ),
        None,
        extra={
            "status": status,
            "duration": round(seconds, 6),
            "trace_id": answer["trace_id"],
        },
    )
    log.handle(record)
