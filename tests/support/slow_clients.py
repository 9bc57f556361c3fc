"""Hostile connections held against a served process: some drip a request's
headers a byte at a time and never finish them, some connect and send nothing.
One thread keeps them all; any the server closes is opened again (as an
attacker would), so the pressure lasts until ``stop()``. Every wait is bounded."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from dataclasses import dataclass, field

# What a drip sends, a byte per tick, starting again when it runs out.
DRIP = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 4096


def connect(port: int, timeout: float = 5.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setblocking(False)
    return sock


def closed_by_peer(sock: socket.socket) -> bool:
    """The server closed (or reset) this connection; never blocks."""
    if sock.fileno() < 0:
        return True
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(65536) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@dataclass
class _Held:
    sock: socket.socket
    drips: bool
    sent: int = 0


@dataclass
class Loiterers:
    port: int
    drip: int
    silent: int
    tick_s: float = 1.0
    reopened: int = 0
    failed_connects: int = 0
    _held: list[_Held] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Loiterers:
        for index in range(self.drip + self.silent):
            self._held.append(_Held(connect(self.port), drips=index < self.drip))
        self._thread = threading.Thread(target=self._run, name="loiterers", daemon=True)
        self._thread.start()
        return self

    def open_count(self) -> int:
        return len(self._held)

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            for held in self._held:
                if held.drips:
                    try:
                        held.sock.send(DRIP[held.sent % len(DRIP) : held.sent % len(DRIP) + 1])
                        held.sent += 1
                    except OSError:
                        self._reopen(held)
                        continue
                if closed_by_peer(held.sock):
                    self._reopen(held)

    def _reopen(self, held: _Held) -> None:
        with contextlib.suppress(OSError):
            held.sock.close()
        held.sent = 0
        try:
            held.sock = connect(self.port, timeout=2.0)
            self.reopened += 1
        except OSError:
            self.failed_connects += 1
            held.sock = socket.socket()  # closed-looking; retried next tick
            held.sock.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for held in self._held:
            with contextlib.suppress(OSError):
                held.sock.close()

    def __enter__(self) -> Loiterers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_closed(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed ``sock``, or None if it stayed open."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if closed_by_peer(sock):
            return time.monotonic() - started
        time.sleep(0.05)
    return None
