"""gunicorn configuration for running kandev-es in production on PostgreSQL.

Usage (tables are created once, before any worker starts):

    kandev-es db init && gunicorn -c http/gunicorn.conf.py 'kandev_es.api:create_app()'

Settings come from the same environment as `kandev-es serve`
(KANDEV_DATABASE_URL, KANDEV_DATA_DIR, KANDEV_POOL_SIZE, ...). Workers must not
create tables themselves: several processes issuing CREATE TABLE IF NOT EXISTS
at once fail on PostgreSQL, so this file defaults KANDEV_CREATE_TABLES to "n"
and `kandev-es db init` has to run first.

Environment read here:
    KANDEV_BIND       address to listen on           (default 127.0.0.1:8000)
    KANDEV_WORKERS    worker processes               (default 2 x CPU cores)
    KANDEV_THREADS    request threads per worker     (default 8; plus KANDEV_MAX_STREAMS
                      threads for event streams, default 32)
    KANDEV_TIMEOUT    worker timeout in seconds      (default 60)

The worker class is kandev-es's own (src/kandev_es/http_worker.py): gunicorn
supervises, waitress serves. One event-driven I/O thread per worker reads each
request whole (headers, and the body up to KANDEV_MAX_BODY_BYTES, chunked or
not) before a request thread sees it, so slow or silent clients hold no thread.
Bounds from the environment (docs/security.md: Input limits and streams):
    KANDEV_HEADER_TIMEOUT   seconds for a request's headers        (default 10)
    KANDEV_BODY_TIMEOUT     seconds for its body, from its start    (default 30)
    KANDEV_IDLE_TIMEOUT     seconds a connection may sit idle       (default 5)
    KANDEV_SEND_TIMEOUT     seconds an answer may wait for its reader (default 60)
    KANDEV_MAX_CONNECTIONS  open connections per worker             (default 2048)

On the embedded SQLite default there is a single writer: prefer
`kandev-es serve`, or set KANDEV_WORKERS=1.

Background work (the projection loop, the ledger sequencer, the recovery
Runtime, the webhook deliverer) runs in ONE process beside the workers, not in
them: the master's `when_ready` starts `kandev-es background`, starts it again
if it dies, and `on_exit` stops it (src/kandev_es/background/supervisor.py).
This file sets KANDEV_BACKGROUND=process unless it is set: `external` starts
none (run `kandev-es background` yourself, e.g. under systemd), `threads` runs
the loops in every worker instead. Each loop leads by a lock of its own, so
several nodes (or processes) still have one leader per role.

Workers share their /metrics values through files in `<KANDEV_DATA_DIR>/metrics`
(prometheus_client's multiprocess mode): `on_starting` wipes and names it before
any worker forks, `child_exit` retires a dead worker's live gauges. Do not set
preload_app: the workers must import prometheus_client after the master named it.

This directory is deliberately not a Python package (a top-level `http` package
would shadow the standard library's `http`).
"""

from __future__ import annotations

import multiprocessing
import os
import sys

from kandev_es.config import load_settings
from kandev_es.errors import InvalidSetting
from kandev_es.server import gunicorn_settings


def _int_env(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    try:
        number = int(value) if value else default
    except ValueError:
        raise InvalidSetting(f"{name} must be an integer, got {value!r}") from None
    if number < 1:
        raise InvalidSetting(f"{name} must be at least 1, got {number}")
    return number


# Workers never create tables; `kandev-es db init` does, once.
os.environ.setdefault("KANDEV_CREATE_TABLES", "n")
# One background process beside the workers (the master starts it); the workers,
# which inherit this, run no background work themselves (create_app()).
os.environ.setdefault("KANDEV_BACKGROUND", "process")
loglevel = (os.environ.get("KANDEV_LOG_LEVEL") or "info").lower()

bind = os.environ.get("KANDEV_BIND") or "127.0.0.1:8000"
# What `kandev-es serve` sets too: worker class (http_worker.py, bound to these
# settings), request threads plus one per capped SSE stream (docs/security.md:
# Input limits and streams), the redacting access log on stdout, timeouts, and the
# metrics hooks on_starting and child_exit, the background process's when_ready and
# on_exit. gunicorn reads this module's names as its settings.
# (gunicorn's keepalive does not apply: KANDEV_IDLE_TIMEOUT closes idle connections.)
try:
    workers = _int_env("KANDEV_WORKERS", 2 * multiprocessing.cpu_count())
    globals().update(
        gunicorn_settings(
            load_settings(),
            _int_env("KANDEV_THREADS", 8),
            timeout=_int_env("KANDEV_TIMEOUT", 60),
            log_level=loglevel,
        )
    )
except InvalidSetting as error:
    # A usage error, as `kandev-es` reports it: one line, exit 2 (not gunicorn's
    # "Failed to read config file" traceback; SystemExit passes through it).
    print(f"Error: {error.message}", file=sys.stderr)
    raise SystemExit(2) from None
errorlog = "-"  # gunicorn's own log on stderr


def post_fork(server: object, worker: object) -> None:
    """Give the application's log lines (kandev_es.*, the access line) a stderr
    handler in each worker, text or JSON (KANDEV_LOG_FORMAT), redacted, with
    each request's id; `kandev-es serve` does the same through its CLI."""
    from kandev_es.observability import logs

    logs.configure(loglevel, load_settings().log_format)
