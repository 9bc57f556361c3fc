"""A real webhook receiver on 127.0.0.1 (stdlib HTTP server, a thread per
request) that records every request it gets and answers as a test says:
``answer(received, nth)`` -> (status, headers, body) or a callable that does
something else (hold the connection, answer slowly)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    @property
    def event(self) -> dict[str, Any]:
        return dict(json.loads(self.body))

    @property
    def webhook_id(self) -> str:
        return self.headers["webhook-id"]


Answer = tuple[int, dict[str, str], bytes]
Behaviour = Callable[["Received", int], Answer | None]


def ok(received: Received, nth: int) -> Answer:
    return 200, {}, b"ok"


class Receiver:
    def __init__(self, behaviour: Behaviour = ok) -> None:
        self.behaviour = behaviour
        self.on_request: Callable[[Any], None] | None = None
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body leave as written

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                got = Received(
                    self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.time()
                )
                nth = receiver._record(got)
                if receiver.on_request is not None:  # a behaviour that writes the answer itself
                    receiver.on_request(self.wfile)
                answer = receiver.behaviour(got, nth)
                if answer is None:  # the behaviour answered (or never will) itself
                    return
                status, headers, payload = answer
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                with contextlib.suppress(OSError):  # the deliverer stopped reading
                    self.wfile.write(payload)

            do_GET = do_POST

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _record(self, got: Received) -> int:
        with self._changed:
            self.received.append(got)
            nth = sum(1 for r in self.received if r.headers.get("webhook-id") == got.webhook_id)
            self._changed.notify_all()
            return nth

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def wait_for(
        self, condition: Callable[[list[Received]], bool], timeout: float = 30.0
    ) -> list[Received]:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not condition(self.received):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"receiver: condition not met in {timeout} s; got"
                        f" {[(r.event.get('type'), r.webhook_id) for r in self.received]}"
                    )
                self._changed.wait(min(left, 0.2))
            return list(self.received)

    def ids(self) -> list[str]:
        with self._lock:
            return [r.webhook_id for r in self.received]
