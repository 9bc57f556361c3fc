"""The SSE consumers of the bench's 'fanout' section (benchlib/fanout.py), in a
process of their own: one thread reading every stream's socket as it comes
(selectors), finding each task.created frame's subject with one regular
expression over what arrived, not a Python loop and a JSON decode per line.
In the bench's own process, 50 consumer threads held its interpreter lock
against its 16 client threads (the load itself slowed), and their per-line
parsing was most of the consumers' CPU, on the same cores as the server.

    python fanout_consumers.py PORT TOKEN WORKSPACE AFTER COUNT WAIT_S

Prints ``ready`` once every stream answered 200; then reads one line on stdin,
the JSON list of the task ids the load made, waits (up to WAIT_S) until every
consumer has every one of them (or its stream ended), and prints one JSON
object: ``missing`` and ``twice`` summed over the consumers, ``ended`` (the
streams' last comments), ``frames`` (task.created frames received) and
``cpu_ns`` (this process's CPU time since it started)."""

from __future__ import annotations

import json
import re
import resource
import selectors
import socket
import sys
import time
from collections import Counter
from typing import Any

CREATED = re.compile(
    rb'\nevent: task\.created\ndata: \{"id": "[^"]*", "type": "task\.created",'
    rb' "subject": "([^"]+)"'
)
# After a newline only (what is parsed always starts with one: Stream.buffer):
# an alternative with ^ kept the expression from searching for its literal
# start, and tried it at every byte (4 of 5 us per frame).
CLOSED = re.compile(rb"\n: stream closed: ([^\n]*)")
CHUNK = 1 << 18


class Stream:
    """One consumer: its socket and the subjects of the task.created it got."""

    def __init__(self, port: int, token: str, workspace: str, after: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.sendall(
            f"GET /api/v1/workspaces/{workspace}/events/stream?after={after}&max_seconds=600"
            f" HTTP/1.0\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            got = self.sock.recv(CHUNK)
            if not got:
                raise SystemExit(f"stream closed before its headers: {head!r}")
            head += got
        head, self.buffer = head.split(b"\r\n\r\n", 1)
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            raise SystemExit(f"stream refused: {head!r} {self.buffer!r}")
        self.buffer = b"\n" + self.buffer  # every frame's line starts after a newline
        self.got: Counter[bytes] = Counter()
        self.ending = ""
        self.open = True
        self.sock.setblocking(False)

    def read(self) -> int:
        """Takes what arrived; the task.created frames it completed."""
        try:
            data = self.sock.recv(CHUNK)
        except BlockingIOError:
            return 0
        except OSError:
            data = b""
        if not data:
            self.open = False
            data = b"\n\n"
        self.buffer += data
        cut = self.buffer.rfind(b"\n\n")
        if cut < 0:
            return 0
        done, self.buffer = self.buffer[: cut + 2], self.buffer[cut + 1 :]
        found = CREATED.findall(done)
        self.got.update(found)
        closed = CLOSED.search(done)
        if closed:
            self.ending = ": stream closed: " + closed.group(1).decode(errors="replace")
        return len(found)


def follow(streams: list[Stream], selector: selectors.BaseSelector, seconds: float) -> int:
    """Reads the streams for up to ``seconds``; the frames completed."""
    frames = 0
    for key, _ in selector.select(seconds):
        stream: Stream = key.data
        frames += stream.read()
        if not stream.open:
            selector.unregister(stream.sock)
    return frames


def main(argv: list[str]) -> int:
    port, token, workspace, after, count, wait_s = argv
    streams = [Stream(int(port), token, workspace, int(after)) for _ in range(int(count))]
    selector = selectors.DefaultSelector()
    for stream in streams:
        selector.register(stream.sock, selectors.EVENT_READ, stream)
    selector.register(sys.stdin, selectors.EVENT_READ, None)
    print("ready", flush=True)
    frames, made = 0, None
    while made is None:
        for key, _ in selector.select(1.0):
            if key.data is None:
                made = json.loads(sys.stdin.readline() or "[]")
                selector.unregister(sys.stdin)
                continue
            frames += key.data.read()
            if not key.data.open:
                selector.unregister(key.data.sock)
    wanted = {task.encode() for task in made}
    deadline = time.monotonic() + float(wait_s)
    while time.monotonic() < deadline and any(
        s.open and not s.ending and not wanted <= s.got.keys() for s in streams
    ):
        frames += follow(streams, selector, 0.1)
    end = time.monotonic() + 0.3  # anything twice would come now
    while time.monotonic() < end:
        frames += follow(streams, selector, 0.05)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result: dict[str, Any] = {
        "missing": sum(len(wanted - s.got.keys()) for s in streams),
        "twice": sum(n - 1 for s in streams for n in s.got.values() if n > 1),
        "ended": dict(Counter(s.ending for s in streams if s.ending)),
        "frames": frames,
        "cpu_ns": int((usage.ru_utime + usage.ru_stime) * 1e9),
    }
    print(json.dumps(result), flush=True)
    for stream in streams:
        stream.sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
