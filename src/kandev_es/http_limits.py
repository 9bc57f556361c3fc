"""What a request may be before the application sees it, for the waitress
worker (http_worker.py; docs/security.md: Input limits and streams).

waitress bounds only the request line and headers together (256 KiB). A
production front end bounds each part, as gunicorn does: the request line
(414), the number of header fields and the bytes of one field (431). The
parser checks them as the head arrives, so a 200 KB URL is refused once its
first 4 KB are in, not after the whole head. waitress' own refusals (400
malformed, 413 too large, 431) and ours are answered in the API's JSON error
shape, and the connection is closed.
"""

from __future__ import annotations

import json

from waitress.parser import HTTPRequestParser
from waitress.task import ErrorTask
from waitress.utilities import Error, RequestHeaderFieldsTooLarge, find_double_newline

from kandev_es.config import Settings
from kandev_es.errors import (
    BadRequest,
    HeaderFieldsTooLarge,
    KandevError,
    PayloadTooLarge,
    RequestLineTooLong,
)
from kandev_es.observability.serving import HEADER as REQUEST_ID_HEADER
from kandev_es.observability.serving import new_request_id

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
    """waitress' request parser, refusing a head over ``limits`` as it arrives."""

    limits: HeadLimits

    def received(self, data: bytes) -> int:
        if self.completed or self.headers_finished:  # type: ignore[has-type]
            return int(super().received(data))
        pending = self.header_plus + data
        end = find_double_newline(pending)
        head = pending if end < 0 else pending[:end].rstrip(b"\r\n")
        refused = self.limits.refusal(head, complete=end >= 0)
        if refused is None:
            return int(super().received(data))
        # As waitress does for its own head limit: a stub request carrying the error.
        self.parse_header(b"GET / HTTP/1.0\r\n")
        self.error = refused
        self.completed = True
        return len(data)


def limited_parser(limits: HeadLimits) -> type[LimitedParser]:
    return type("KandevParser", (LimitedParser,), {"limits": limits})


class JsonErrorTask(ErrorTask):  # type: ignore[misc]
    """waitress' parser errors and ours answered in the API's error shape
    instead of waitress' text."""

    def execute(self) -> None:
        error = self.request.error
        known: KandevError
        if error.code == 413:
            known = PayloadTooLarge("request body is too large")
        elif error.code == 414:
            known = RequestLineTooLong(str(error.body))
        elif error.code == 431:
            known = HeaderFieldsTooLarge(str(error.body))
        elif error.code == 400:
            known = BadRequest(f"malformed request: {error.body}")
        else:
            known = KandevError(str(error.body))
            known.code = str(error.reason).lower().replace(" ", "_")
        # Refused before the app saw it: an id of its own, as every answer has.
        request_id = new_request_id()
        body = json.dumps({**known.to_dict(), "request_id": request_id}).encode()
        self.status = f"{error.code} {error.reason}"
        self.response_headers.append(("Content-Type", "application/json"))
        self.response_headers.append((REQUEST_ID_HEADER, request_id))
        self.set_close_on_finish()
        self.channel.refused = True  # it lingers before closing (http_worker.TimedChannel)
        self.content_length = len(body)
        self.write(body)
