"""One delivery attempt over HTTP (httpx), SSRF-guarded at connect.

- Every connection resolves the URL's host itself and connects only if every
  address is permitted (``NetworkPolicy``): a DNS answer that changed since
  subscribe time (rebinding) is refused here. TLS still verifies the name.
- No redirect is followed (a 3xx is a failure), no proxy from the
  environment is used (it would connect on our behalf, unchecked). A
  subscription keeps its one connection up to KEEPALIVE_SECONDS between
  deliveries (a new connection is checked again).
- Bounded: ``timeout`` seconds for the whole attempt (every connect, write
  and read of its connection waits only until that deadline); at most
  ``SNIPPET_READ`` bytes of the answer are read, of which a short snippet,
  secrets blanked, is kept (never a body, never a header).
"""

from __future__ import annotations

import ssl
import time
import typing
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

import httpcore
import httpx

from kandev_es.errors import KandevError
from kandev_es.redaction import redact
from kandev_es.webhooks.addresses import NetworkPolicy, resolve

SNIPPET_READ = 4096
SNIPPET_CHARS = 200
USER_AGENT = "kandev-es-webhooks/1"
# One connection per subscription, kept between its deliveries for this long
# (checked when made; a receiver's answer not read whole closes it).
KEEPALIVE_SECONDS = 5.0


class DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read and write waits at most until the
    attempt's deadline (``GuardedBackend.deadline``): httpx's timeouts bound
    each phase and each read, so an answer trickled a byte at a time would
    otherwise hold the subscription for as long as its bytes keep coming."""

    def __init__(self, inner: httpcore.NetworkStream, backend: GuardedBackend) -> None:
        self._inner = inner
        self._backend = backend

    def _left(self, timeout: float | None) -> float:
        left = self._backend.deadline - time.monotonic()
        if left <= 0:
            raise httpcore.ReadTimeout("the attempt's time is up")
        return left if timeout is None else min(timeout, left)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._left(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._left(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        tls = self._inner.start_tls(ssl_context, server_hostname, self._left(timeout))
        return DeadlineStream(tls, self._backend)

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


class GuardedBackend(httpcore.SyncBackend):
    """httpcore's own backend, but the host is resolved and checked here and
    the connection made to a checked address, bounded by ``deadline`` (set
    for each attempt by ``post``)."""

    def __init__(self, policy: NetworkPolicy) -> None:
        self._policy = policy
        self.deadline = float("inf")

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.NetworkStream:
        try:
            addresses = self._policy.check(resolve(host, port))
        except KandevError as error:
            raise httpcore.ConnectError(error.message) from None
        last: Exception | None = None
        for address in addresses:
            left = self.deadline - time.monotonic()
            if left <= 0:
                break
            wait = left if timeout is None else min(timeout, left)
            try:
                stream = super().connect_tcp(address, port, wait, local_address, socket_options)
            except httpcore.ConnectError as error:
                last = error
                continue
            return DeadlineStream(stream, self)
        raise last or httpcore.ConnectTimeout("the attempt's time is up")


class GuardedTransport(httpx.HTTPTransport):
    def __init__(self, policy: NetworkPolicy) -> None:
        super().__init__(trust_env=False, retries=0)
        self.backend = GuardedBackend(policy)
        # httpx builds its pool without a way to name the network backend:
        # the same pool, with ours (tests/unit/test_library_internals.py).
        self._pool = httpcore.ConnectionPool(
            ssl_context=self._pool._ssl_context,
            max_connections=1,
            max_keepalive_connections=1,
            keepalive_expiry=KEEPALIVE_SECONDS,
            network_backend=self.backend,
        )


@dataclass(frozen=True)
class Outcome:
    status: int | None  # None: no answer (refused, timed out, address refused)
    latency_ms: float
    snippet: str
    retry_after: float | None = None

    @property
    def delivered(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


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


def post(
    client: httpx.Client, url: str, body: bytes, headers: dict[str, str], timeout: float
) -> Outcome:
    """POST ``body``; the answer's status, latency and snippet, or why none."""
    started = time.monotonic()
    deadline = started + timeout
    backend: GuardedBackend | None = getattr(client, "guarded_backend", None)
    if backend is not None:
        backend.deadline = deadline
    try:
        with client.stream("POST", url, content=body, headers=headers) as response:
            raw = b""
            for chunk in response.iter_raw():
                raw += chunk
                if len(raw) >= SNIPPET_READ or time.monotonic() > deadline:
                    break
            elapsed = (time.monotonic() - started) * 1000
            return Outcome(
                response.status_code,
                elapsed,
                _snippet(raw[:SNIPPET_READ]),
                retry_after(response.headers.get("retry-after"), time.time()),
            )
    except httpx.TimeoutException:
        reason = f"timed out after {timeout:g} s"
    except (OSError, httpx.HTTPError) as error:
        reason = _snippet(str(error).encode()) or type(error).__name__
    return Outcome(None, (time.monotonic() - started) * 1000, reason)


def new_client(policy: NetworkPolicy, timeout: float) -> httpx.Client:
    """One subscription's client: its attempts bounded by ``timeout`` each,
    whole (``post`` sets the deadline its connection reads and writes by)."""
    transport = GuardedTransport(policy)
    client = httpx.Client(
        transport=transport,
        timeout=httpx.Timeout(timeout),
        follow_redirects=False,
        trust_env=False,
        headers={"user-agent": USER_AGENT},
    )
    client.guarded_backend = transport.backend  # type: ignore[attr-defined]
    return client
