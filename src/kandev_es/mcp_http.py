"""`kandev-es mcp --http`: uvicorn serving the MCP app (mcp/server.http_app)
behind the same front as `kandev-es serve` (http_worker.py, http_limits.py;
docs/security.md: Input limits and streams; docs/observability.md: Request ids).

uvicorn's h11 protocol answers a request it cannot parse itself, in plain text
(400 "Invalid HTTP request received."), with no request id, no access line
and no count; it bounds a head only as a whole and times out neither a head
nor a body. ``FrontProtocol`` adds, each small:
- the request line (414), the number and bytes of header fields (431) and a
  declared body (413) bounded as `serve` bounds them, a long request line
  refused as it arrives (the rest of the head read, up to HEAD_BYTES, for the
  caller's id), a head over HEAD_BYTES 431 (h11's bound);
- a time for a request's headers from its first byte (408), and an idle time
  for a connection with no request (closed without a word);
- every refusal (h11's malformed request too) answered through the app's
  front layer (observability/asgi.py: the caller's id kept, an access line, a
  count in /metrics) in the API's JSON error shape; the connection then stops
  sending and drops what still comes for LINGER_S before it closes (closing
  with a body unread would send a reset that can cost the client its answer).
``bounded_body`` reads a body whole within KANDEV_BODY_TIMEOUT (408) and up
to KANDEV_MAX_BODY_BYTES (413: a chunked one), and ``/metrics`` is served as
`serve` serves it (no token).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
import h11
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import STATUS_PHRASES, H11Protocol

from kandev_es import metrics
from kandev_es.bootstrap import Services
from kandev_es.config import Settings
from kandev_es.errors import (
    BadRequest,
    HeaderFieldsTooLarge,
    KandevError,
    MethodNotAllowed,
    PayloadTooLarge,
    RequestLineTooLong,
    RequestTimeout,
    TransferEncodingUnsupported,
)
from kandev_es.http_limits import HEAD_BYTES, TARGET_SHOWN, HeadLimits, caller_id, typed
from kandev_es.http_worker import LINGER_S
from kandev_es.mcp.server import http_app
from kandev_es.observability.asgi import REFUSAL, answer_error, with_request_ids
from kandev_es.webhooks import observed

log = logging.getLogger("kandev_es.mcp")
_METHOD = re.compile(rb"[A-Z]{1,16}")
_PROTOCOL = re.compile(rb"HTTP/(\d\.\d)")


class _Connection(h11.Connection):
    """h11's connection, keeping the protocol error it raised and checking
    each request's head (``check``) as it is parsed, before the app runs."""

    check: Callable[[h11.Request], KandevError | None]
    last_error: h11.RemoteProtocolError | None = None
    refusal: KandevError | None = None  # ours, raised as h11's error (uvicorn catches that)

    def next_event(self) -> Any:
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as error:
            self.last_error = error
            raise
        if isinstance(event, h11.Request):
            self.refusal = self.check(event)
            if self.refusal is not None:
                self.last_error = h11.RemoteProtocolError(self.refusal.message)
                raise self.last_error
        return event


class _LingeringTransport:
    """The connection's transport: closed while the client may still be
    sending (a refusal, a body unread), it stops sending (FIN after the
    answer), drops what comes and closes after LINGER_S or when the client does."""

    def __init__(self, transport: asyncio.Transport, protocol: FrontProtocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self.lingering = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()

    def close(self) -> None:
        if self.lingering or self._transport.is_closing():
            return
        if not self._protocol.input_unread() or not self._transport.can_write_eof():
            self._transport.close()
            return
        try:
            self._transport.write_eof()  # once what is buffered is sent
        except OSError:  # the client is gone already
            self._transport.close()
            return
        self.lingering = True
        self._protocol.flow.resume_reading()  # paused under a body's backlog: drop it
        self._protocol.loop.call_later(LINGER_S, self._transport.close)

    def end(self) -> None:
        """Closed now, lingering or not (the server stops)."""
        self._transport.close()


class FrontProtocol(H11Protocol):
    """uvicorn's h11 protocol with the front's bounds and refusals (module doc)."""

    settings: Settings = Settings()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        connection = _Connection(h11.SERVER, max_incomplete_event_size=HEAD_BYTES)
        connection.check = self._checked
        self.conn = connection
        self._head = bytearray()  # the request's bytes so far, while its head arrives
        self._head_timer: asyncio.TimerHandle | None = None
        self._request: h11.Request | None = None
        self._early: KandevError | None = None  # refused as it arrived: reading on for the id
        self.refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_LingeringTransport(transport, self))  # type: ignore[arg-type]
        # uvicorn times out only a connection that has answered a request.
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        """The server stops: a refused or lingering connection is closed now
        (h11 would refuse to close one whose answer it did not send)."""
        if self.refused or self.transport.is_closing():
            self.transport.end()  # type: ignore[attr-defined]
        else:
            super().shutdown()

    def input_unread(self) -> bool:
        """Whether the client may still be sending what this side will not read."""
        return self.refused or self.conn.their_state in (h11.SEND_BODY, h11.ERROR)

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        if self.refused or getattr(self.transport, "lingering", False):
            return  # dropped: the request was refused
        if self.conn.their_state is h11.IDLE:  # a request's head arriving
            if not self._head:
                self._start_head_timer()
            if self._take_head(data):
                return
        super().data_received(data)

    def _take_head(self, data: bytes) -> bool:
        """Keep ``data`` as part of the head (up to HEAD_BYTES); True when it is
        not for h11: the request line was refused as it arrived, and the rest
        of the head is read (dropped, but for the caller's id) to its end."""
        seen = len(self._head)
        self._head += data[: max(0, HEAD_BYTES - seen)]
        if self._early is None:
            head = self._head.lstrip(b"\r\n")
            line = head.find(b"\n")
            length = len(head) if line < 0 else len(head[:line].rstrip(b"\r"))
            if length <= self.settings.max_request_line:
                return False
            self._early = RequestLineTooLong(
                f"request line over {self.settings.max_request_line} bytes"
            )
        ended = self._head.find(b"\r\n\r\n", max(0, seen - 3)) >= 0
        if ended or self._head.find(b"\n\n", max(0, seen - 1)) >= 0 or seen >= HEAD_BYTES:
            self._refuse(self._early)
        return True

    def _start_head_timer(self) -> None:
        self._stop_head_timer()
        self._head_timer = self.loop.call_later(self.settings.header_timeout, self._head_late)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if not self.refused and self.conn.their_state is h11.IDLE:
            timeout = self.settings.header_timeout
            self._refuse(
                self._early or RequestTimeout(f"headers not received within {timeout:g} s")
            )

    def _checked(self, request: h11.Request) -> KandevError | None:
        """Why a parsed request's head is refused, or None (its head is done)."""
        self._stop_head_timer()
        self._request, self._head = request, bytearray()
        settings = self.settings
        line = len(request.method) + len(request.target) + len(b" HTTP/1.1") + 1
        if line > settings.max_request_line:
            return RequestLineTooLong(f"request line over {settings.max_request_line} bytes")
        if len(request.headers) > settings.max_header_fields:
            return HeaderFieldsTooLarge(f"more than {settings.max_header_fields} header fields")
        if any(len(k) + 2 + len(v) > settings.max_header_field_bytes for k, v in request.headers):
            return HeaderFieldsTooLarge(
                f"a header field over {settings.max_header_field_bytes} bytes"
            )
        length = dict(request.headers).get(b"content-length")
        if length is not None and int(length) > settings.max_body_bytes:
            return PayloadTooLarge("request body is too large")
        return None

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to h11's protocol errors (and to our refusals): ours."""
        error = getattr(self.conn, "last_error", None)
        refusal = getattr(self.conn, "refusal", None)
        bounds = HeadLimits(self.settings).refusal(bytes(self._head), complete=True)
        if refusal is not None:
            self._refuse(refusal)
        elif bounds is not None and self._request is None:  # over a bound, and malformed
            self._refuse(typed(bounds))
        elif error is not None and error.error_status_hint == 431:
            self._refuse(HeaderFieldsTooLarge(f"request head over {HEAD_BYTES} bytes"))
        elif error is not None and error.error_status_hint == 501:
            self._refuse(TransferEncodingUnsupported(str(error)))
        else:
            self._refuse(BadRequest(f"malformed request: {error or msg}"))

    def _refuse(self, error: KandevError) -> None:
        """Answer ``error`` through the app's front layer, then close (lingering)."""
        if self.refused:
            return
        self.refused = True
        self._stop_head_timer()
        self._unset_keepalive_if_required()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the app reading its body is let go
            self.cycle.message_event.set()
        task = self.loop.create_task(self._answer(self._refusal_scope(error)))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def _refusal_scope(self, error: KandevError) -> dict[str, Any]:
        """The refused request as the app's front layer sees it: its method,
        a bounded target and protocol (what its access line shows), the
        caller's X-Request-Id, and the error to answer."""
        if self._request is not None:
            method, target = self._request.method, self._request.target
            protocol = b"HTTP/" + self._request.http_version
            caller = dict(self._request.headers).get(b"x-request-id")
        else:
            parts = bytes(self._head).lstrip(b"\r\n").partition(b"\n")[0].rstrip(b"\r").split(b" ")
            method = parts[0] if _METHOD.fullmatch(parts[0]) else b"-"
            target = parts[1] if len(parts) > 1 else b"-"
            protocol = parts[-1] if len(parts) > 2 and _PROTOCOL.fullmatch(parts[-1]) else b"-"
            caller = caller_id(bytes(self._head))
        shown = target[:TARGET_SHOWN] + (b"..." if len(target) > TARGET_SHOWN else b"")
        version = _PROTOCOL.fullmatch(protocol)
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": version.group(1).decode() if version else "",
            "method": method.decode("latin-1"),
            "scheme": "http",
            "path": shown.decode("latin-1"),
            "raw_path": shown,
            "query_string": b"",
            "root_path": "",
            "headers": [] if caller is None else [(b"x-request-id", caller)],
            "client": self.client,
            "server": self.server,
            "extensions": {REFUSAL: error},
            "state": {},
        }

    async def _answer(self, scope: dict[str, Any]) -> None:
        parts: list[bytes] = []

        async def receive() -> Message:
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = int(message["status"])
                parts.append(b"HTTP/1.1 %d %s\r\n" % (status, STATUS_PHRASES[status]))
                parts.extend(b"%s: %s\r\n" % (k, v) for k, v in message.get("headers", []))
                parts.append(b"\r\n")
            elif message["type"] == "http.response.body":
                parts.append(message.get("body", b""))

        try:
            await self.app(scope, receive, send)
            self.transport.write(b"".join(parts))
        finally:
            self.transport.close()


def front_protocol(settings: Settings) -> type[FrontProtocol]:
    """The protocol class, bound to the server's settings."""
    return type("KandevFrontProtocol", (FrontProtocol,), {"settings": settings})


def bounded_body(app: ASGIApp, settings: Settings) -> ASGIApp:
    """``app`` given each request's body whole, read within
    KANDEV_BODY_TIMEOUT (else 408) and up to KANDEV_MAX_BODY_BYTES (else 413:
    a declared length over it is refused by the front before the app runs).
    The MCP SDK reads a body whole before it answers anyway."""

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        try:
            with anyio.fail_after(settings.body_timeout):
                body = await _read_body(receive, settings.max_body_bytes)
        except TimeoutError:
            timeout = settings.body_timeout
            await answer_error(
                RequestTimeout(f"body not received within {timeout:g} s"), send, True
            )
            return
        except PayloadTooLarge as error:
            await answer_error(error, send, close=True)
            return
        if body is not None:
            await app(scope, _replayed(body, receive), send)

    return serve


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The request's body (None: the client left first)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge("request body is too large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replayed(body: bytes, receive: Receive) -> Receive:
    """``receive`` giving ``body`` first, whole, then what the connection says."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def with_metrics(app: ASGIApp, exposition: Callable[[], bytes], path: str = "/metrics") -> ASGIApp:
    """``app`` with GET ``path``: the Prometheus scrape, no token (as `serve`'s)."""

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != path:
            await app(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD"):
            refused = MethodNotAllowed("the metrics are read with GET")
            await answer_error(refused, send, extra=[(b"allow", b"GET, HEAD")])
            return
        body = await anyio.to_thread.run_sync(exposition)
        headers = [(b"content-type", metrics.CONTENT_TYPE.encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return serve


def front_app(services: Services, host: str, path: str = "/mcp") -> ASGIApp:
    """The MCP app behind the front's layers: request ids, access lines and
    counts outermost, then /metrics, then the body's bounds."""

    def exposition() -> bytes:
        return metrics.exposition(
            services.projections.lag, lambda: observed.families(services.webhooks.store)
        )

    app = bounded_body(http_app(services, host, path), services.settings)
    return with_request_ids(
        with_metrics(app, exposition), metrics.record_request, frozenset({path, "/metrics"})
    )


def serve(services: Services, host: str, port: int, path: str = "/mcp") -> None:
    import uvicorn

    settings = services.settings
    app = front_app(services, host, path)
    metrics.instruments()  # made now, so a scrape shows them at 0
    services.projections.start_thread(settings.projection_poll_seconds)
    log.info("mcp streamable HTTP on http://%s:%s%s", host, port, path)
    uvicorn.run(
        app,
        host=host,
        port=port,
        http=front_protocol(settings),
        # Our lines only, in KANDEV_LOG_FORMAT: uvicorn's loggers go to the
        # root's handler, its access line is off (ours is the app's), and its
        # "Invalid HTTP request" warning is an answer with an access line now.
        log_config=None,
        log_level="error",
        access_log=False,
        # No proxy is trusted: forwarded headers say nothing (as `serve`).
        proxy_headers=False,
        server_header=False,
        timeout_keep_alive=max(1, math.ceil(settings.idle_timeout)),
    )
