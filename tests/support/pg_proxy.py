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

Connections must not use TLS (the URL gets ``sslmode=disable``)."""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import urlsplit, urlunsplit

READY_FOR_QUERY = b"Z\x00\x00\x00\x05"
CHUNK = 65536


class _Pair:
    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
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
            pair = _Pair(client, server)
            with self._lock:
                self._pairs.append(pair)
            threading.Thread(target=self._upward, args=(pair,), daemon=True).start()
            threading.Thread(target=self._downward, args=(pair,), daemon=True).start()

    def _upward(self, pair: _Pair) -> None:
        """Client to server; arms the pair when the trapped message goes by."""
        try:
            while data := pair.client.recv(CHUNK):
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
