"""What a request may be before the application sees it, for the waitress
worker (http_worker.py; docs/security.md: Input limits and streams).

waitress bounds only the request line and headers together (256 KiB). A
production front end bounds each part, as gunicorn does: the request line
(414), the number of header fields and the bytes of one field (431). The
parser checks them as the head arrives, so a 200 KB URL is refused once its
first 4 KB are in, not after the whole head. waitress' own refusals (400
malformed, 413 too large, 431), ours and the worker's 408 are answered by the
app's front layer like any answer (the caller's X-Request-Id kept, an access
line, a count in /metrics; RefusalTask), in the API's JSON error shape, and
the connection is closed.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from waitress.parser import HTTPRequestParser
from waitress.task import WSGITask
from waitress.utilities import Error, RequestHeaderFieldsTooLarge, find_double_newline

from kandev_es.config import Settings
from kandev_es.errors import (
    BadRequest,
    HeaderFieldsTooLarge,
    KandevError,
    PayloadTooLarge,
    RequestLineTooLong,
    RequestTimeout,
    TransferEncodingUnsupported,
)
from kandev_es.observability.middleware import REFUSAL_KEY
from kandev_es.observability.serving import WSGI_HEADER as WSGI_REQUEST_ID

# waitress' bound on the request line and headers together.
HEAD_BYTES = 262_144


class RequestLineTooLongError(Error):  # type: ignore[misc]
    code = 414
    reason = "URI Too Long"


class HeadLimits:
    """The request line, header fields and field bytes a request may have."""

    def __init__(self, settings: Settings) -> None:
        self.line = settings.max_request_line
        self.fields = settings.max_header_fields
        self.field_bytes = settings.max_header_field_bytes

    def refusal(self, head: bytes, complete: bool) -> Error | None:
        """Why ``head`` (the request's bytes up to the blank line, or all that
        came so far) is refused, or None. An unfinished last line counts once it
        is already too long."""
        lines = head.lstrip(b"\r\n").split(b"\n")
        if len(lines[0].rstrip(b"\r")) > self.line:
            return RequestLineTooLongError(f"request line over {self.line} bytes")
        fields = lines[1:] if complete else lines[1:-1]
        if len(fields) > self.fields:
            return RequestHeaderFieldsTooLarge(f"more than {self.fields} header fields")
        if any(len(field.rstrip(b"\r")) > self.field_bytes for field in lines[1:]):
            return RequestHeaderFieldsTooLarge(f"a header field over {self.field_bytes} bytes")
        return None


class LimitedParser(HTTPRequestParser):  # type: ignore[misc]
    """waitress' request parser, refusing a head over ``limits`` as it arrives.
    A request refused while its head was arriving keeps the bytes seen then
    (``head_seen``: its answer's access line shows its first line). A head
    refused by our limits before its end is read on to its end (or to
    HEAD_BYTES) and dropped, but for the caller's X-Request-Id line: the
    answer names the caller's id wherever in the head it came."""

    limits: HeadLimits
    error: Any  # waitress': the refusal, or None
    header_plus: bytes  # waitress': the head so far
    head_seen = b""
    caller_id: bytes | None = None
    draining = False  # refused: the rest of the head is read for the id only
    _drained = 0
    _tail = b""

    def received(self, data: bytes) -> int:
        if self.draining:
            return self._drain(data)
        if self.completed or self.headers_finished:  # type: ignore[has-type]
            return int(super().received(data))
        pending = self.header_plus + data
        end = find_double_newline(pending)
        head = pending if end < 0 else pending[:end].rstrip(b"\r\n")
        refused = self.limits.refusal(head, complete=end >= 0)
        if refused is None:
            consumed = int(super().received(data))
            if self.error is not None:  # waitress' own: malformed, too large
                self.head_seen = pending if end < 0 else pending[:end]
            return consumed
        # As waitress does for its own head limit: a stub request carrying the error.
        self.parse_header(b"GET / HTTP/1.0\r\n")
        self.error = refused
        self.head_seen = pending if end < 0 else pending[:end]
        self.caller_id = caller_id(self.head_seen)
        self.header_plus = b""
        self.draining, self._drained = True, len(pending)
        if end >= 0:
            self.completed, self.draining = True, False
        else:
            self._tail = _last_line(pending)
        return len(data)

    def _drain(self, data: bytes) -> int:
        """The rest of a refused head: dropped, but for the caller's id line."""
        window = self._tail + data
        end = find_double_newline(window)
        if self.caller_id is None:
            # From 1: the window starts with the newline before a line, or mid-line.
            found = _CALLER_ID.search(window if end < 0 else window[:end], 1)
            self.caller_id = found.group(1) if found else None
        self._drained += len(data)
        if end >= 0 or self._drained >= HEAD_BYTES:
            # All taken: what follows the head is dropped too (the answer closes).
            self.completed, self.draining = True, False
        self._tail = _last_line(window)
        return len(data)


def _last_line(head: bytes) -> bytes:
    """The unfinished last line of ``head`` from the newline before it, if it
    could still become an id line; else nothing."""
    start = head.rfind(b"\n", max(0, len(head) - ID_LINE_BYTES))
    return head[start:] if start >= 0 else b""


def limited_parser(limits: HeadLimits) -> type[LimitedParser]:
    return type("KandevParser", (LimitedParser,), {"limits": limits})


class RequestTimeoutError(Error):  # type: ignore[misc]
    code = 408
    reason = "Request Timeout"


def typed(error: Error) -> KandevError:
    """waitress' error (or ours) as the API's typed error."""
    if error.code == 413:
        return PayloadTooLarge("request body is too large")
    if error.code == 414:
        return RequestLineTooLong(str(error.body))
    if error.code == 431:
        return HeaderFieldsTooLarge(str(error.body))
    if error.code == 408:
        return RequestTimeout(str(error.body))
    if error.code == 400:
        return BadRequest(f"malformed request: {error.body}")
    if error.code == 501:
        return TransferEncodingUnsupported(str(error.body))
    return KandevError("internal server error")  # 500: the body is waitress' text


# A whole line of the head (an unfinished last one is not read); the longest
# well-formed id line (serving.MAX_LENGTH), with room to spare.
_CALLER_ID = re.compile(rb"^x-request-id:[ \t]*([^\r\n]*?)[ \t]*\r?\n", re.I | re.M)
ID_LINE_BYTES = 256
_METHOD = re.compile(rb"[A-Z]{1,16}")
_PROTOCOL = re.compile(rb"HTTP/\d\.\d")
# The most of a refused request's target its access line shows.
TARGET_SHOWN = 200


def caller_id(head: bytes) -> bytes | None:
    """The value of the first whole X-Request-Id line after the first line of ``head``."""
    found = _CALLER_ID.search(head.lstrip(b"\r\n"), pos=1)
    return found.group(1) if found else None


def _request_facts(request: HTTPRequestParser) -> tuple[bytes, str | None]:
    """A refused request's first line and the caller's X-Request-Id, from the
    head seen (refused while arriving) or the parsed request."""
    head = getattr(request, "head_seen", b"")
    if head:
        caller = getattr(request, "caller_id", None) or caller_id(head)
        line = head.lstrip(b"\r\n").partition(b"\n")[0].rstrip(b"\r")
        return line, caller.decode("latin-1") if caller else None
    return getattr(request, "first_line", b""), request.headers.get("X_REQUEST_ID")


def refusal_environ(request: HTTPRequestParser, remote: str) -> dict[str, Any]:
    """The WSGI environ of a request the front refused: what its access line
    shows (method, a bounded target, protocol, peer), the caller's id, and the
    typed error the front answers (observability/middleware.py)."""
    line, caller = _request_facts(request)
    parts = line.split(b" ")
    method = parts[0] if _METHOD.fullmatch(parts[0]) else b"-"
    target = parts[1] if len(parts) > 1 else b"-"
    shown = target[:TARGET_SHOWN] + (b"..." if len(target) > TARGET_SHOWN else b"")
    protocol = parts[-1] if len(parts) > 2 and _PROTOCOL.fullmatch(parts[-1]) else b"-"
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method.decode("latin-1"),
        "RAW_URI": shown.decode("latin-1"),
        "SERVER_PROTOCOL": protocol.decode("latin-1"),
        "REMOTE_ADDR": remote,
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr,
        REFUSAL_KEY: typed(request.error),
    }
    if caller is not None:
        environ[WSGI_REQUEST_ID] = caller
    return environ


class RefusalTask(WSGITask):  # type: ignore[misc]
    """waitress' parser errors and ours (and the worker's 408) answered by the
    app's front layer (observability/middleware.py: the one path of every
    answer) instead of waitress' text: the caller's id kept, the answer
    logged and counted. The connection is closed after it."""

    environ: dict[str, Any] | None = None

    def get_environment(self) -> dict[str, Any]:
        if self.environ is None:
            self.environ = refusal_environ(self.request, str(self.channel.addr[0]))
        return self.environ

    def execute(self) -> None:
        self.set_close_on_finish()
        self.channel.refused = True  # it lingers before closing (http_worker.TimedChannel)
        super().execute()
