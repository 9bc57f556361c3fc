"""One delivery attempt over HTTP/1.1, SSRF-guarded at connect.

A small client of its own on the standard library's sockets and TLS: a
delivery is one POST of a small body and a short read of the answer, and a
subscription sends them one after another at the rate the feed grows.
httpx spent about 0.5 ms of CPU per attempt and made five system calls
where this makes two or three (one send, one poll and read); in a process
whose other threads keep the interpreter busy, each system call can wait
for the interpreter again, so those calls were most of a delivery's time.

- Every connection resolves the URL's host itself and connects only if every
  address is permitted (``NetworkPolicy``): a DNS answer that changed since
  subscribe time (rebinding) is refused here. TLS verifies the name (the
  system's trust store).
- No redirect is followed (a 3xx is a failure), no proxy is used (it would
  connect on our behalf, unchecked).
- A subscription keeps its one connection up to KEEPALIVE_SECONDS between
  deliveries when the answer was read whole (a length, or chunks, of at most
  SNIPPET_READ bytes) and not ``Connection: close``; a new connection is
  checked again. A kept connection the receiver closed meanwhile (no byte of
  an answer came back) is replaced and the request sent once more on the new
  one: the same ``webhook-id``, which a receiver dedupes.
- Bounded: ``timeout`` seconds for the whole attempt (every connect, write
  and read waits only until that deadline, however an answer trickles in);
  at most SNIPPET_READ bytes of the answer's body and HEAD_READ of its head
  are read, of which a short snippet, secrets blanked, is kept (never a
  body, never a header).
"""

from __future__ import annotations

import contextlib
import re
import socket
import ssl
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from types import TracebackType
from urllib.parse import quote, urlsplit

from kandev_es.errors import InternalError, KandevError
from kandev_es.redaction import redact
from kandev_es.webhooks.addresses import NetworkPolicy, resolve

SNIPPET_READ = 4096
SNIPPET_CHARS = 200
HEAD_READ = 64 * 1024  # an answer's status line and headers, at most
USER_AGENT = "kandev-es-webhooks/1"
# One connection per subscription, kept between its deliveries for this long
# (checked when made; a receiver's answer not read whole closes it).
KEEPALIVE_SECONDS = 5.0
_STATUS = re.compile(rb"HTTP/1\.([01]) ([1-9][0-9][0-9])(?: [^\r\n]*)?")
_PATH_SAFE = "/%:@!$&'()*+,;=-._~?"
_TLS: ssl.SSLContext | None = None


class AnswerError(InternalError):
    """The receiver's answer is not one HTTP/1.1 answer (or never came)."""


class _Closed(AnswerError):
    """The connection ended before any byte of an answer."""


@dataclass(frozen=True)
class Outcome:
    status: int | None  # None: no answer (refused, timed out, address refused)
    latency_ms: float
    snippet: str
    retry_after: float | None = None

    @property
    def delivered(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes  # at most SNIPPET_READ bytes of it
    reusable: bool  # read whole: the connection may carry the next request


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds a ``Retry-After`` asks for (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # "²" is a digit to str.isdigit, not to float
        return float(value)
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - now)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _snippet(raw: bytes) -> str:
    """At most SNIPPET_CHARS of an answer, on one line, secrets blanked."""
    text = " ".join(raw.decode("utf-8", "replace").split())
    return redact(text)[:SNIPPET_CHARS]


def _tls() -> ssl.SSLContext:
    global _TLS
    if _TLS is None:
        _TLS = ssl.create_default_context()
    return _TLS


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the attempt's time is up")
    return left


class _Reader:
    """The answer's bytes as they come, each read waiting at most until the
    deadline, HEAD_READ + SNIPPET_READ of them at most."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline
        self.buffer = b""
        self.total = 0

    def more(self) -> bool:
        """Read what comes next into ``buffer``; False at its end (or the cap)."""
        if self.total >= HEAD_READ + SNIPPET_READ:
            return False
        self._sock.settimeout(_left(self._deadline))
        data = self._sock.recv(65536)
        if not data:
            return False
        self.buffer += data
        self.total += len(data)
        return True

    def head(self) -> tuple[int, str, dict[str, str]]:
        """The next status line and headers: status, HTTP minor version, headers."""
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            if len(self.buffer) > HEAD_READ:
                raise AnswerError(f"the answer's head is over {HEAD_READ} bytes")
            if not self.more():
                if self.total == 0:
                    raise _Closed("the receiver closed the connection without an answer")
                raise AnswerError("the receiver closed the connection inside the answer's head")
        if end > HEAD_READ:
            raise AnswerError(f"the answer's head is over {HEAD_READ} bytes")
        lines = self.buffer[:end].split(b"\r\n")
        self.buffer = self.buffer[end + 4 :]
        matched = _STATUS.fullmatch(lines[0])
        if matched is None:
            raise AnswerError("the answer is not HTTP/1.x")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or name != name.strip():
                raise AnswerError("the answer has a malformed header line")
            headers[name.decode("latin-1").lower()] = value.strip().decode("latin-1")
        return int(matched.group(2)), matched.group(1).decode(), headers

    def sized(self, length: int) -> tuple[bytes, bool]:
        """A body of ``length`` bytes: its first SNIPPET_READ, whether read whole."""
        want = min(length, SNIPPET_READ)
        while len(self.buffer) < want and self.more():
            pass
        return self.buffer[:want], length <= SNIPPET_READ and len(self.buffer) == length

    def to_end(self) -> bytes:
        """A body that ends with the connection: its first SNIPPET_READ bytes."""
        while len(self.buffer) < SNIPPET_READ and self.more():
            pass
        return self.buffer[:SNIPPET_READ]

    def chunked(self) -> tuple[bytes, bool]:
        """A chunked body: its first SNIPPET_READ bytes, whether read whole
        (its last chunk, with no trailer, was read)."""
        body = b""
        while len(body) < SNIPPET_READ:
            end = self.buffer.find(b"\r\n")
            if end < 0 or len(self.buffer) < end + 2 + self._size(end) + 2:
                if not self.more():
                    return body, False
                continue
            size = self._size(end)
            if size == 0:
                return body, self.buffer[end + 2 : end + 4] == b"\r\n"
            body += self.buffer[end + 2 : end + 2 + size]
            self.buffer = self.buffer[end + 2 + size + 2 :]
        return body[:SNIPPET_READ], False

    def _size(self, end: int) -> int:
        text = self.buffer[:end].split(b";", 1)[0].strip()
        if not text or len(text) > 16 or not re.fullmatch(rb"[0-9A-Fa-f]+", text):
            raise AnswerError("the answer has a malformed chunk")
        return int(text, 16)


def read_answer(sock: socket.socket, deadline: float) -> Answer:
    """The receiver's answer to one request (1xx interim answers skipped)."""
    reader = _Reader(sock, deadline)
    status, minor, headers = reader.head()
    while 100 <= status < 200:
        status, minor, headers = reader.head()
    if status in (204, 304):
        body, whole = b"", True
    elif "chunked" in headers.get("transfer-encoding", "").lower():
        body, whole = reader.chunked()
    elif "content-length" in headers:
        length = headers["content-length"]
        if not (length.isascii() and length.isdigit()):
            raise AnswerError("the answer's Content-Length is not a number")
        body, whole = reader.sized(int(length))
    else:
        body, whole = reader.to_end(), False
    close = "close" in headers.get("connection", "").lower() or minor == "0"
    return Answer(status, headers, body, whole and not close)


@dataclass(frozen=True)
class _Origin:
    scheme: str
    host: str
    port: int


class Connection:
    """A subscription's one connection to its receiver (``new_client``)."""

    def __init__(self, policy: NetworkPolicy, timeout: float) -> None:
        self._policy = policy
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._origin: _Origin | None = None
        self._idle_since = 0.0

    def __enter__(self) -> Connection:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        sock, self._sock, self._origin = self._sock, None, None
        if sock is not None:
            with contextlib.suppress(OSError):  # already gone
                sock.close()

    def exchange(self, origin: _Origin, request: bytes, deadline: float) -> Answer:
        """Send ``request`` and read its answer, on the kept connection when
        it is to the same origin and fresh, else on a new (checked) one."""
        kept = (
            self._sock is not None
            and self._origin == origin
            and time.monotonic() - self._idle_since < KEEPALIVE_SECONDS
        )
        if not kept:
            self.close()
        try:
            try:
                return self._send(origin, request, deadline)
            except (_Closed, ConnectionResetError, BrokenPipeError):
                if not kept:
                    raise
                self.close()  # the receiver closed the kept one: once more, anew
                return self._send(origin, request, deadline)
        except BaseException:
            self.close()
            raise

    def _send(self, origin: _Origin, request: bytes, deadline: float) -> Answer:
        if self._sock is None:
            self._sock = self._connect(origin, deadline)
            self._origin = origin
        self._sock.settimeout(_left(deadline))
        self._sock.sendall(request)
        answer = read_answer(self._sock, deadline)
        if answer.reusable:
            self._idle_since = time.monotonic()
        else:
            self.close()
        return answer

    def _connect(self, origin: _Origin, deadline: float) -> socket.socket:
        """A connection to a permitted address of ``origin``'s host (resolved
        now), made within the deadline; TLS for https."""
        addresses = self._policy.check(resolve(origin.host, origin.port))
        last: OSError | None = None
        for address in addresses:
            try:
                sock = socket.create_connection((address, origin.port), _left(deadline))
            except TimeoutError:
                raise
            except OSError as error:
                last = error
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if origin.scheme != "https":
                return sock
            try:
                sock.settimeout(_left(deadline))
                return _tls().wrap_socket(sock, server_hostname=origin.host)
            except BaseException:
                sock.close()
                raise
        raise last or TimeoutError("the attempt's time is up")


def _request(url: str, body: bytes, headers: dict[str, str]) -> tuple[_Origin, bytes]:
    """The URL's origin and the request's bytes (headers and body, one write)."""
    parts = urlsplit(url)
    scheme, host = parts.scheme, parts.hostname or ""
    default = 443 if scheme == "https" else 80
    port = parts.port or default
    target = quote(parts.path or "/", safe=_PATH_SAFE)
    if parts.query:
        target += "?" + quote(parts.query, safe=_PATH_SAFE)
    name = host.encode("idna").decode("ascii") if not host.isascii() else host
    name = f"[{name}]" if ":" in name else name
    lines = [
        f"POST {target} HTTP/1.1",
        f"host: {name}" + ("" if port == default else f":{port}"),
        f"user-agent: {USER_AGENT}",
        f"content-length: {len(body)}",
        *(f"{key}: {value}" for key, value in headers.items()),
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return _Origin(scheme, host, port), head + body


def post(
    client: Connection, url: str, body: bytes, headers: dict[str, str], timeout: float
) -> Outcome:
    """POST ``body``; the answer's status, latency and snippet, or why none."""
    started = time.monotonic()
    try:
        origin, request = _request(url, body, headers)
        answer = client.exchange(origin, request, started + timeout)
        return Outcome(
            answer.status,
            (time.monotonic() - started) * 1000,
            _snippet(answer.body),
            retry_after(answer.headers.get("retry-after"), time.time()),
        )
    except TimeoutError:
        reason = f"timed out after {timeout:g} s"
    except KandevError as error:  # the address refused, the host not resolving
        reason = _snippet(error.message.encode())
    except (OSError, AnswerError, ValueError, UnicodeError) as error:
        reason = _snippet(str(error).encode()) or type(error).__name__
    return Outcome(None, (time.monotonic() - started) * 1000, reason)


def new_client(policy: NetworkPolicy, timeout: float) -> Connection:
    """One subscription's connection: its attempts bounded by ``timeout``
    each, whole."""
    return Connection(policy, timeout)
