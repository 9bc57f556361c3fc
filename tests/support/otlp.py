"""An OTLP/HTTP trace receiver for tests: a real HTTP server on loopback that
decodes each export (protobuf, opentelemetry-proto) into plain span records."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class Span:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...] = field(default=())
    start: int = 0  # ns since the epoch


def _value(any_value: Any) -> Any:
    return getattr(any_value, any_value.WhichOneof("value") or "string_value")


def _spans(payload: bytes) -> list[Span]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(payload)
    return [
        Span(
            span.trace_id.hex(),
            span.span_id.hex(),
            span.parent_span_id.hex(),
            span.name,
            span.kind,
            {a.key: _value(a.value) for a in span.attributes},
            tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
            span.start_time_unix_nano,
        )
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]


class Receiver:
    """Collects every span POSTed to ``<url>/v1/traces``; ``wait`` until a
    condition holds (bounded)."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name
                payload = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver._changed:
                    receiver.spans.extend(_spans(payload))
                    receiver._changed.notify_all()
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def wait(self, holds: Callable[[list[Span]], bool], seconds: float = 30.0) -> list[Span]:
        deadline = time.monotonic() + seconds
        with self._changed:
            while not holds(self.spans):
                left = deadline - time.monotonic()
                assert left > 0, f"spans never arrived; got {[s.name for s in self.spans]}"
                self._changed.wait(left)
            return list(self.spans)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
