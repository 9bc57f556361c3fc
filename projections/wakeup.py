"""How the projection loop sleeps between passes.

PostgreSQL: every save sends ``NOTIFY <events table>`` right after it commits
(storage/recorders.py), so we LISTEN on that channel on a dedicated autocommit
connection. A NOTIFY only shortens the
sleep; the timed poll stays as the fallback, so a lost notification or a killed
LISTEN connection costs at most one poll interval. A broken connection is
dropped and re-opened on the next wait.

SQLite: no notifications; plain timed polling.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any, Protocol

from kandev_es.application import Tasks
from kandev_es.storage.database import Database

log = logging.getLogger("kandev_es.projections")
SLICE_SECONDS = 0.5


class Waker(Protocol):
    def wait(self, seconds: float, stop: threading.Event) -> bool: ...

    def close(self) -> None: ...


class PollWaker:
    def wait(self, seconds: float, stop: threading.Event) -> bool:
        stop.wait(seconds)
        return False

    def close(self) -> None:
        pass


class PostgresListener:
    """LISTEN on the event store's channel; reconnect whenever it breaks."""

    def __init__(self, url: str, channel: str) -> None:
        self._url = url
        self._channel = channel
        self._connection: Any = None
        self.backend_pid: int | None = None
        self.connects = 0

    def _connect(self) -> Any:
        import psycopg
        from psycopg import sql

        connection = psycopg.connect(
            self._url,
            autocommit=True,
            application_name=f"kandev-es-listener-{os.getpid()}",
        )
        connection.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
        self.backend_pid = connection.info.backend_pid
        self.connects += 1
        if self.connects > 1:
            log.info("projection listener reconnected (pid %s)", self.backend_pid)
        return connection

    def wait(self, seconds: float, stop: threading.Event) -> bool:
        """Sleep up to ``seconds``; True when a notification woke us early."""
        deadline = time.monotonic() + seconds
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                if self._connection is None:
                    self._connection = self._connect()
                    return True  # notifications may have been missed: run a pass now
                for _ in self._connection.notifies(
                    timeout=min(remaining, SLICE_SECONDS), stop_after=1
                ):
                    return True
            except Exception as error:  # a killed backend, a restart: poll, then reconnect
                log.warning("projection listener lost (%s); polling until it is back", error)
                self.close()
                stop.wait(max(min(remaining, SLICE_SECONDS), 0))
        return False

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):  # closing a dead connection
                connection.close()


def make_waker(app: Tasks, database: Database) -> Waker:
    url = getattr(database, "conninfo", None)
    if database.backend != "postgres" or not url:
        return PollWaker()
    channel = str(getattr(app.recorder, "channel_name", "kandev_events"))
    return PostgresListener(url, channel)
