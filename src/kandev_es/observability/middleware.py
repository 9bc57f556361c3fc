"""The WSGI layer in front of the app, whatever server runs it: each request
gets its id (``serving.accepted``: the caller's ``X-Request-Id`` when well
formed), every answer carries it in ``X-Request-Id``, and once the answer has
been sent the access line is written (logger ``kandev_es.access``: method,
path and query, status, bytes, seconds; redacted like every line)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import quote

from kandev_es.observability import serving, tracing
from kandev_es.observability.logs import ACCESS_LOGGER

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
ENVIRON_KEY = "kandev.request_id"
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


def with_request_ids(app: WSGIApp) -> WSGIApp:
    """``app`` answering with ``X-Request-Id`` and logging its access line."""

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
            return start_response(status, headers, *exc)

        def done(sent: int) -> None:
            try:
                _access_line(environ, answer, sent, time.perf_counter() - started)
            finally:
                serving.end()

        try:
            body = app(environ, start)
        except BaseException:
            serving.end()
            raise
        return _Answer(body, done)

    return serve


def _access_line(
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
