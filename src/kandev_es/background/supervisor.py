"""The gunicorn master's side of the background process (`kandev-es serve` and
http/gunicorn.conf.py): once the master is ready it starts ``kandev-es
background`` beside the web workers (one per node, whatever the number of
workers), starts another when it dies (after RESTART_SECONDS, doubling up to
MAX_RESTART_SECONDS while it keeps dying within STABLE_SECONDS of its start),
and stops it when the master exits (SIGTERM, then SIGKILL after
STOP_SECONDS). The child gets the master's settings through its environment
and command line; it stops by itself if the master is killed (``--parent``).

One supervisor per master process (``_current``): gunicorn builds its hooks
again on a reload (HUP), which must not start a second one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

from kandev_es import metrics
from kandev_es.config import Settings

log = logging.getLogger("kandev_es.background")
RESTART_SECONDS = 1.0
MAX_RESTART_SECONDS = 30.0
STABLE_SECONDS = 10.0
STOP_SECONDS = 10.0
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")  # what `kandev-es --log-level` takes
# What ends the gunicorn master: from then on a background process that ends
# is not started again (its process group's SIGTERM reaches it too).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


def command(settings: Settings, parent: int, log_level: str | None = None) -> list[str]:
    """``kandev-es background`` as the master starts it: this interpreter, the
    master's log level, its pid to watch, and the URL agents call (serve's
    --host/--port, which the environment does not carry)."""
    args = [sys.executable, "-m", "kandev_es.cli"]
    if log_level and log_level.upper() in LOG_LEVELS:
        args += ["--log-level", log_level.upper()]
    args += ["background", "--parent", str(parent)]
    if settings.agent_api_url:
        args += ["--agent-api-url", settings.agent_api_url]
    return args


def environment(settings: Settings, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The master's environment (the metrics directory included) with the store
    it serves: serve's --data-dir and --database-url are not in the environment."""
    env = dict(os.environ if base is None else base)
    env["KANDEV_DATA_DIR"] = str(settings.data_dir)
    env.pop("KANDEV_DATABASE_URL", None)
    if settings.database_url:
        env["KANDEV_DATABASE_URL"] = settings.database_url
    env["KANDEV_CREATE_TABLES"] = "n"  # the master (or `db init`) made them
    return env


class Supervisor:
    def __init__(self, args: list[str], env: Mapping[str, str]) -> None:
        self._args = args
        self._env = dict(env)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._renewing = threading.Event()
        self._process: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        self.starts = 0

    @property
    def pid(self) -> int | None:
        process = self._process
        return None if process is None else process.pid

    def start(self) -> None:
        with self._lock:
            if self._thread is not None or self._stopping.is_set():
                return
            self._process = self._spawn()
        self._thread = threading.Thread(
            target=self._watch, name="background-supervisor", daemon=True
        )
        self._thread.start()

    def _spawn(self) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(self._args, env=self._env, stdin=subprocess.DEVNULL)
        self.starts += 1
        log.info("background: started pid %d (start %d)", process.pid, self.starts)
        return process

    def _watch(self) -> None:
        delay = RESTART_SECONDS
        while not self._stopping.is_set():
            process = self._process
            if process is not None:
                began = time.monotonic()
                code = process.wait()
                metrics.worker_exited(process.pid)  # its live gauges (projection leader) end
                if self._stopping.is_set():
                    return
                if time.monotonic() - began >= STABLE_SECONDS or self._renewing.is_set():
                    delay = RESTART_SECONDS
                self._ended(process.pid, code, delay)
            if self._stopping.wait(0 if self._renewing.is_set() else delay):
                return
            self._renewing.clear()
            delay = min(delay * 2, MAX_RESTART_SECONDS)
            with self._lock:
                if self._stopping.is_set():
                    return
                try:
                    self._process = self._spawn()
                except OSError as error:  # no fork or exec now: try again later
                    log.error("background: could not start: %s", error)
                    self._process = None

    def _ended(self, pid: int, code: int, delay: float) -> None:
        if self._renewing.is_set():
            log.info("background: pid %d stopped for a reload; starting another", pid)
        else:
            log.error(
                "background: pid %d ended (exit status %s); starting another in %.0f s",
                pid,
                code,
                delay,
            )

    def renew(self) -> None:
        """gunicorn's reload (HUP): the workers start again with the code
        installed now, so does the background process (SIGTERM; the next one
        is started at once, with the same command and environment)."""
        with self._lock:
            process = self._process
            if self._stopping.is_set() or process is None or process.poll() is not None:
                return
            self._renewing.set()
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)

    def stopping(self) -> None:
        """The master is stopping: a background process that ends stays ended."""
        self._stopping.set()

    def stop(self, seconds: float = STOP_SECONDS) -> None:
        with self._lock:
            self._stopping.set()
            process = self._process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(seconds)
        except subprocess.TimeoutExpired:
            log.warning(
                "background: pid %d did not stop within %.0f s; killed", process.pid, seconds
            )
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()
        if self._thread is not None:
            self._thread.join(1.0)


_current: Supervisor | None = None


def hooks(settings: Settings, log_level: str | None = None) -> dict[str, Callable[..., None]]:
    """gunicorn's ``when_ready`` (start the background process), ``on_reload``
    (start it again, as the workers are) and ``on_exit`` (stop it) for a master
    serving ``settings``."""

    def when_ready(server: Any) -> None:
        global _current
        if _current is None:
            _current = Supervisor(command(settings, os.getpid(), log_level), environment(settings))
            _flag_stop_signals(_current)
        _current.start()

    def on_reload(server: Any) -> None:
        if _current is not None:
            _current.renew()

    def on_exit(server: Any) -> None:
        if _current is not None:
            _current.stop()

    return {"when_ready": when_ready, "on_reload": on_reload, "on_exit": on_exit}


def _flag_stop_signals(supervisor: Supervisor) -> None:
    """Before gunicorn's own handler: a stop signal says the master stops (it
    runs ``on_exit`` only once its workers have ended)."""
    for signum in STOP_SIGNALS:
        previous = signal.getsignal(signum)

        def _handle(number: int, frame: FrameType | None, previous: Any = previous) -> None:
            supervisor.stopping()
            if callable(previous):
                previous(number, frame)

        signal.signal(signum, _handle)
