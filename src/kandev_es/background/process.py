"""``kandev-es background``: the node's background work in a process of its
own, beside the web workers (started by `serve` and http/gunicorn.conf.py's
hooks, or by an operator, e.g. under systemd). It runs until SIGTERM or
SIGINT, or until the process that started it is gone (``parent``: a
supervisor killed with SIGKILL leaves no background process behind), then
stops its loops and closes the store."""

from __future__ import annotations

import logging
import os
import signal
import threading
from types import FrameType

from kandev_es import metrics
from kandev_es.background import work
from kandev_es.bootstrap import bootstrap
from kandev_es.config import Settings
from kandev_es.observability import tracing

log = logging.getLogger("kandev_es.background")
# How often the process looks whether its parent is still there.
PARENT_CHECK_SECONDS = 1.0


def run(settings: Settings, parent: int | None = None, metrics_port: int | None = None) -> None:
    """Until a stop signal (or ``parent`` gone): the background work of this
    node; with ``metrics_port``, its metrics on 127.0.0.1 at that port."""
    stop = threading.Event()
    _stop_on_signals(stop)
    # Before the store's pools connect: psycopg's instrumentation traces the
    # connections made after it (observability/tracing.py).
    tracing.configure(settings)
    services = bootstrap(settings)
    listener = None
    try:
        if metrics_port is not None:
            listener = metrics.serve_alone(metrics_port, services.projections.lag)
        started = work.start(services)
        log.info("background: pid %d runs %s", os.getpid(), ", ".join(started.names))
        try:
            _wait(stop, parent)
        finally:
            started.stop(services)
    finally:
        if listener is not None:
            listener.shutdown()
        services.close()
    log.info("background: pid %d stopped", os.getpid())


def _stop_on_signals(stop: threading.Event) -> None:
    def _handle(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _handle)
    signal.signal(signal.SIGINT, _handle)


def _wait(stop: threading.Event, parent: int | None) -> None:
    while not stop.wait(PARENT_CHECK_SECONDS):
        if parent is not None and os.getppid() != parent:
            log.warning(
                "background: the process that started it (pid %d) is gone; stopping", parent
            )
            return
