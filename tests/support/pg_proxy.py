"""A TCP proxy in front of the test PostgreSQL that injects real network
faults between the service and the database: nothing is mocked, the service
talks the real wire protocol to a real server through it.

- ``cut()`` / ``restore()``: an outage. Every open connection is closed and
  new ones are refused (accepted, then closed at once) until restored.
- ``lose_answer(*markers)``: the next client message containing a marker (a
  save's event topic, sent in the clear in its Bind message) is forwarded;
  the server executes and commits it, and the proxy swallows its answer up to
  and including ReadyForQuery (sent only after the commit) and closes the
  connection instead: a save that committed and whose answer was lost.
- ``cut_after(*markers)``: the answer to that message is delivered, then the
  outage starts (``cut()``): the save succeeded, everything after it fails.

Connections must not use TLS (the URL gets ``sslmode=disable``).

``statements()`` counts what the clients asked the server to run: each simple
query (``Q``) and each execution of an extended-protocol statement (``E``),
read off the messages going up."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections import Counter
from urllib.parse import urlsplit, urlunsplit

READY_FOR_QUERY = b"Z\x00\x00\x00\x05"
CHUNK = 65536


# Requests sent before the startup message (no type byte): TLS, GSS encryption.
_PRE_STARTUP = {80877103, 80877104}


class _Messages:
    """The frontend messages of one connection, counted by type as they go by."""

    def __init__(self, counts: Counter[bytes], lock: threading.Lock) -> None:
        self._counts, self._lock = counts, lock
        self._buffer = b""
        self._started = False  # past the startup message: every message has a type byte

    def feed(self, data: bytes) -> None:
        self._buffer += data
        while True:
            header = 4 if not self._started else 5
            if len(self._buffer) < header:
                return
            if not self._started:
                (length,) = struct.unpack("!I", self._buffer[:4])
                if len(self._buffer) < 8:
                    return
                (code,) = struct.unpack("!I", self._buffer[4:8])
                self._started = code not in _PRE_STARTUP
                kind = b""
            else:
                kind = self._buffer[:1]
                (length,) = struct.unpack("!I", self._buffer[1:5])
                length += 1
            if len(self._buffer) < length:
                return
            self._buffer = self._buffer[length:]
            if kind:
                with self._lock:
                    self._counts[kind] += 1


class _Pair:
    def __init__(self, client: socket.socket, server: socket.socket, messages: _Messages) -> None:
        self.client = client
        self.server = server
        self.messages = messages
        self.trapped: str | None = None  # "lose" or "cut" once the marker went by

    def close(self) -> None:
        for end in (self.client, self.server):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()


class PgProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._down = False
        self._trap: tuple[tuple[bytes, ...], str] | None = None
        self.sprung = threading.Event()
        self._closed = False
        self._messages: Counter[bytes] = Counter()
        threading.Thread(target=self._accept, daemon=True).start()

    @classmethod
    def before(cls, url: str) -> tuple[PgProxy, str]:
        """A proxy in front of the server ``url`` names, and the same URL
        pointing at the proxy."""
        parts = urlsplit(url)
        proxy = cls(parts.hostname or "127.0.0.1", parts.port or 5432)
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{proxy.port}"
        netloc_new = f"{netloc[0]}@{host}" if len(netloc) == 2 else host
        query = parts.query + ("&" if parts.query else "") + "sslmode=disable"
        return proxy, urlunsplit(parts._replace(netloc=netloc_new, query=query))

    # ----- faults --------------------------------------------------------------
    def cut(self) -> None:
        with self._lock:
            self._down = True
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.close()

    def restore(self) -> None:
        with self._lock:
            self._down = False

    def lose_answer(self, *markers: bytes) -> None:
        self._arm(markers, "lose")

    def cut_after(self, *markers: bytes) -> None:
        self._arm(markers, "cut")

    def _arm(self, markers: tuple[bytes, ...], kind: str) -> None:
        with self._lock:
            self.sprung.clear()
            self._trap = (markers, kind)

    # ----- counts --------------------------------------------------------------
    def statements(self) -> int:
        """Statements the clients have had the server run so far (``Q`` + ``E``)."""
        with self._lock:
            return self._messages[b"Q"] + self._messages[b"E"]

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._listener.close()

    # ----- plumbing ------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                down = self._down
            if down:
                client.close()
                continue
            try:
                server = socket.create_connection(self._upstream)
            except OSError:
                client.close()
                continue
            pair = _Pair(client, server, _Messages(self._messages, self._lock))
            with self._lock:
                self._pairs.append(pair)
            threading.Thread(target=self._upward, args=(pair,), daemon=True).start()
            threading.Thread(target=self._downward, args=(pair,), daemon=True).start()

    def _upward(self, pair: _Pair) -> None:
        """Client to server; arms the pair when the trapped message goes by."""
        try:
            while data := pair.client.recv(CHUNK):
                pair.messages.feed(data)
                with self._lock:
                    trap = self._trap
                    if trap is not None and any(marker in data for marker in trap[0]):
                        pair.trapped, self._trap = trap[1], None
                pair.server.sendall(data)
        except OSError:
            pass
        pair.close()

    def _downward(self, pair: _Pair) -> None:
        """Server to client; a trapped pair's answer ends at ReadyForQuery."""
        held = b""
        try:
            while data := pair.server.recv(CHUNK):
                if pair.trapped is None:
                    pair.client.sendall(data)
                    continue
                held += data
                if READY_FOR_QUERY not in held:
                    continue
                if pair.trapped == "cut":
                    pair.client.sendall(held)
                    self.cut()
                self.sprung.set()
                break
        except OSError:
            pass
        pair.close()
