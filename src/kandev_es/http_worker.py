"""The gunicorn worker class of `kandev-es serve` and http/gunicorn.conf.py:
gunicorn supervises (master, worker restarts, hooks, the `timeout` heartbeat),
waitress does the HTTP (docs/security.md: Input limits and streams).

Why: gunicorn's gthread worker hands a connection to one of its threads as soon
as a first byte arrives, so a few dozen clients dripping headers (or sending
nothing) held every thread and /healthz stalled. waitress reads on one
event-driven I/O thread per process (poll, so past 1024 descriptors): a request
reaches a task thread only once its headers and body have fully arrived (the
body decoded if chunked and spooled to a temp file past a size), a body over
the limit is 413 whether chunked or not, and malformed chunks are 400.

What waitress lacks and this module adds, each small:
- a total time for a request's headers and for its body, counted from the
  request's first byte (waitress only closes a channel inactive for a while,
  which a byte a second never is): answered 408 and closed; and a short idle
  time for a connection with no request (closed); enforced in the server's
  maintenance, once a second;
- limits on the request line, header fields and field bytes, and waitress'
  own error answers in the API's JSON error shape (http_limits.py);
- a graceful stop that ends open event streams and lets running answers out.
"""

from __future__ import annotations

import gc
import os
import resource
import socket
import time
from typing import Any

from gunicorn.workers.base import Worker
from waitress import wasyncore
from waitress.channel import HTTPChannel
from waitress.server import BaseWSGIServer, create_server

from kandev_es.config import Settings
from kandev_es.http_limits import (
    HEAD_BYTES,
    HeadLimits,
    RefusalTask,
    RequestTimeoutError,
    limited_parser,
)

# Seconds the worker's loop waits for I/O at most between heartbeats and
# checks of `alive` (gunicorn's SIGTERM); maintenance runs once a second.
SLICE_S = 0.5
# Seconds a connection whose request was refused still reads (and drops) what comes.
LINGER_S = 5.0


class Timeouts:
    """Seconds a request's headers, and its body, may take from its first byte;
    seconds a connection may sit without one."""

    def __init__(self, settings: Settings) -> None:
        self.header = settings.header_timeout
        self.body = settings.body_timeout
        self.idle = settings.idle_timeout


class TimedChannel(HTTPChannel):  # type: ignore[misc]
    """A connection that knows when its current request's first byte came,
    and lingers after refusing a request (http_limits.RefusalTask sets
    ``refused``): closing at once with the rest of a 200 KB head unread would
    send a reset that can cost the client its 414 / 431 answer. So, as nginx
    does, it stops sending (FIN after the answer), reads and drops what still
    comes for up to LINGER_S, and closes then or when the client does."""

    request: Any  # waitress': the request arriving, None between requests
    request_started = 0.0
    refused = False
    lingering_until = 0.0
    timed_out = False

    def handle_close(self) -> None:
        if self.refused and not self.lingering_until and self.connected:
            try:
                self.socket.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            else:
                self.lingering_until = time.time() + LINGER_S
                self.will_close = self.close_when_flushed = False
                return
        super().handle_close()

    def readable(self) -> bool:
        return bool(self.lingering_until) or bool(super().readable())

    def received(self, data: bytes) -> bool:
        if self.lingering_until or self.timed_out:
            return False  # dropped: the request was (or is being) refused
        before = self.request
        result: bool = super().received(data)
        if self.request is not None and self.request is not before:
            self.request_started = time.time()  # waitress' own clock (last_activity)
        return result

    def overdue(self, now: float, timeouts: Timeouts) -> bool:
        """Closing time: its request's headers or body took too long, or the
        connection sat without a request. One being served is only when what
        waits for its client has not moved for channel_timeout: a stream whose
        client stopped reading (its thread, blocked writing, is let go)."""
        if self.lingering_until:
            return now > self.lingering_until
        if self.requests:
            stalled = now - float(self.last_activity) > self.adj.channel_timeout
            return bool(self.total_outbufs_len) and stalled
        request = self.request
        if request is not None and not request.completed:
            limit = timeouts.body if request.headers_finished else timeouts.header
            return now - self.request_started > limit
        idle = now - float(self.last_activity)  # since a byte last came or went
        if self.total_outbufs_len:  # an answer still going out
            return bool(idle > self.adj.channel_timeout)
        return idle > timeouts.idle

    def time_out(self, timeouts: Timeouts) -> bool:
        """An overdue request that began refused with 408 (answered by a task
        thread, like every refusal, then the connection closes); False when
        there is none (a silent connection is closed without an answer)."""
        with self.requests_lock:
            request = self.request
            if request is None or request.completed or self.requests or self.timed_out:
                return False
            if request.error is not None:
                pass  # a head already refused, read on for the caller's id: that answer
            elif request.headers_finished:
                request.error = RequestTimeoutError(f"body not received within {timeouts.body:g} s")
            else:
                request.head_seen = request.header_plus
                request.error = RequestTimeoutError(
                    f"headers not received within {timeouts.header:g} s"
                )
            request.completed = True
            self.timed_out = True
            self.requests.append(request)
            self.request = None
        self.server.add_task(self)
        return True


def _bound(server: BaseWSGIServer, timeouts: Timeouts, limits: HeadLimits) -> None:
    """A server made by waitress.create_server, with our channels (our head
    limits, JSON errors) and a maintenance (waitress calls it every
    cleanup_interval) that closes overdue connections instead of only
    long-inactive ones."""

    def maintenance(now: float) -> None:
        for channel in list(server.active_channels.values()):
            if not channel.overdue(now, timeouts) or channel.time_out(timeouts):
                continue
            if channel.requests:  # stalled: its socket never turns writable to close it
                channel.handle_close()
            else:
                channel.will_close = True

    server.channel_class = type(
        "KandevChannel",
        (TimedChannel,),
        {"parser_class": limited_parser(limits), "error_task_class": RefusalTask},
    )
    server.maintenance = maintenance


class WaitressWorker(Worker):  # type: ignore[misc]
    """A gunicorn worker serving on its inherited sockets with waitress."""

    settings: Settings = Settings()

    def run(self) -> None:
        settings = self.settings
        _freeze_loaded_objects()
        _raise_descriptor_limit(settings.max_connections + 64)
        server = self._server(settings)
        socket_map = server._map if isinstance(server, BaseWSGIServer) else server.map
        servers = [s for s in socket_map.values() if isinstance(s, BaseWSGIServer)]
        for each in servers:
            _bound(each, Timeouts(settings), HeadLimits(settings))
        try:
            while self.alive:
                self.notify()
                if self.ppid != os.getppid():
                    self.log.info("Parent changed, shutting down: %s", self)
                    break
                wasyncore.loop(timeout=SLICE_S, map=socket_map, use_poll=True, count=1)
            self._drain(servers, socket_map)
        finally:
            servers[0].task_dispatcher.shutdown(cancel_pending=True, timeout=1)
            wasyncore.close_all(socket_map)

    def _server(self, settings: Settings) -> Any:
        return create_server(
            # The access line is the app's own (observability/middleware.py).
            self.wsgi,
            sockets=[listener.sock for listener in self.sockets],
            threads=self.cfg.threads,
            connection_limit=settings.max_connections,
            # Our maintenance enforces the header, body and idle times; this one
            # bounds an answer left unread (seconds without a byte taken).
            channel_timeout=settings.send_timeout,
            cleanup_interval=1,
            # A connection whose request is being served stays readable, so a
            # client that leaves is seen at once (waitress.client_disconnected):
            # an event stream on an idle server ends within a second of its
            # client leaving, not at its next write (services/feeds.py).
            channel_request_lookahead=1,
            asyncore_use_poll=True,
            asyncore_loop_timeout=1,
            # KANDEV_MAX_BODY_BYTES is allowed, one byte more is not (waitress: >=).
            max_request_body_size=settings.max_body_bytes + 1,
            # A body arriving is held in memory up to this, then in a temporary
            # file: connections holding unfinished bodies cost little memory.
            inbuf_overflow=settings.body_memory_bytes,
            max_request_header_size=HEAD_BYTES,
            ident="kandev-es",
            # No proxy is trusted: forwarded headers are dropped, the scheme is http.
            trusted_proxy=None,
            clear_untrusted_proxy_headers=True,
            url_scheme="http",
            expose_tracebacks=False,
            log_socket_errors=False,
        )

    def _drain(self, servers: list[BaseWSGIServer], socket_map: dict[int, Any]) -> None:
        """Graceful stop (SIGTERM): accept nothing more, end open event streams
        at once (a last comment: their clients reconnect elsewhere), close each
        connection once it has nothing running or left to send, and let the
        requests being served finish and their answers go out -- for gunicorn's
        graceful_timeout less two seconds, so the worker exits before the
        master's SIGKILL."""
        from kandev_es.services.feeds import end_open_streams

        end_open_streams()
        for each in servers:
            each.accepting = False  # its readable() is False from now on
        deadline = time.monotonic() + max(1, self.cfg.graceful_timeout - 2)
        while time.monotonic() < deadline:
            busy = False
            for channel in (c for each in servers for c in each.active_channels.values()):
                if channel.requests or channel.total_outbufs_len:
                    busy = True
                else:
                    channel.will_close = True  # idle, or its answer all sent
            if not busy:
                return
            self.notify()
            wasyncore.loop(timeout=0.2, map=socket_map, use_poll=True, count=1)


def _freeze_loaded_objects() -> None:
    """The application is loaded: its modules, routes, schemas and pools live
    as long as the worker. Out of the cyclic collector's sight, a full
    collection no longer walks them all (under a Found load, one took about
    0.1 s every few thousand requests, all threads waiting on it)."""
    gc.collect()
    gc.freeze()


def _raise_descriptor_limit(wanted: int) -> None:
    """Each connection is a descriptor: lift the soft limit toward the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def worker_class(settings: Settings) -> type[WaitressWorker]:
    """The worker class, bound to the server's settings (read once, in the master)."""
    return type("KandevWorker", (WaitressWorker,), {"settings": settings})
