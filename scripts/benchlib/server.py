"""Served processes and their clients: gunicorn started as an operator runs it,
a keep-alive stdlib HTTP client, and the one POSTing call every load is made of."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib.common import REPO, WAIT_S


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def kandev(*args: str) -> list[str]:
    script = Path(sys.executable).parent / "kandev-es"
    if script.is_file():
        return [str(script), *args]
    return [sys.executable, "-c", "from kandev_es.cli import main; main()", *args]


def environment(url: str, data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KANDEV_")}
    env.update(
        KANDEV_DATABASE_URL=url,
        KANDEV_DATA_DIR=str(data_dir),
        KANDEV_LOG_LEVEL="warning",
        KANDEV_CREATE_TABLES="n",
        **extra,
    )
    return env


KANDEV_APP = ("kandev_es.api:create_app()",)


class Gunicorn:
    """gunicorn with ``config`` (http/gunicorn.conf.py), or with none and
    ``options`` on its command line instead. Serving kandev-es with the config,
    its master also starts the node's background process (projections, ledger
    sequencer, Runtime, webhook deliverer: docs/operations.md, What runs where),
    so a measurement includes that work as a deployment has it; another app
    (the CRUD peer) gets none (KANDEV_BACKGROUND=external)."""

    def __init__(
        self, env: dict[str, str], workers: int, log: Path,
        app: tuple[str, ...] = KANDEV_APP,
        config: Path | None = REPO / "http" / "gunicorn.conf.py",
        options: tuple[str, ...] = (),
        python: str = sys.executable,
        cwd: Path = REPO,
    ) -> None:
        self.port = free_port()
        self.workers = workers
        env = {**env, "KANDEV_BIND": f"127.0.0.1:{self.port}", "KANDEV_WORKERS": str(workers)}
        if app != KANDEV_APP:
            env.setdefault("KANDEV_BACKGROUND", "external")
        self.log = log
        configured = ("-c", str(config)) if config is not None else ()
        options = tuple(arg.format(port=self.port) for arg in options)
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [python, "-m", "gunicorn", *configured, *options, *app],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=out,
                start_new_session=True, cwd=cwd,
            )
        self.wait_healthy()

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if Client(self.port, "").request("GET", "/healthz")[0] == 200:
                    return
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise SystemExit("gunicorn did not come up:\n" + self.log.read_text(errors="replace"))

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=20)


def gthread_server(env: dict[str, str], workers: int, log: Path) -> Gunicorn:
    """The CRUD peer (scripts/crud_peer.py) as most Flask apps are deployed:
    gunicorn's gthread worker, ``workers`` processes of KANDEV_THREADS threads
    (8 unless set), the request threads kandev-es's workers get."""
    threads = env.get("KANDEV_THREADS") or os.environ.get("KANDEV_THREADS") or "8"
    return Gunicorn(
        env, workers, log, ("--pythonpath", str(REPO / "scripts"), "crud_peer:create_app()"),
        config=None,
        options=("-k", "gthread", "--workers", str(workers), "--threads", threads,
                 "--bind", "127.0.0.1:{port}", "--log-level", "warning"),
    )


class Client:
    """One keep-alive connection (stdlib http.client)."""

    def __init__(self, port: int, token: str) -> None:
        self.port, self.token = port, token
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def request(self, method: str, path: str, payload: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.token}"}
        data = None
        if payload is not None:
            data = json.dumps(payload).encode()
            headers["Content-Type"] = "application/json"
        try:
            self.conn.request(method, path, body=data, headers=headers)
            response = self.conn.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            raise
        return response.status, json.loads(raw) if raw else None


def poster(
    port: int, token: str, make_body: Callable[[], dict[str, Any]], outcome: str,
    failures: Counter[str],
) -> Callable[[], None]:
    """One client's call for a load: POST ``make_body()`` on a keep-alive
    connection of its own; anything but a 200 with ``outcome`` is counted in
    ``failures`` (by error type, or status and error code)."""
    client = Client(port, token)

    def run() -> None:
        try:
            status, reply = client.request("POST", "/api/v1/tasks", make_body())
        except (OSError, http.client.HTTPException) as error:
            failures[type(error).__name__] += 1
            return
        if status != 200 or reply.get("outcome") != outcome:
            failures[f"{status}:{(reply or {}).get('error', reply.get('outcome'))}"] += 1

    return run


def db_init(env: dict[str, str]) -> None:
    """`kandev-es db init` in ``env``, as an operator runs it before serving."""
    init = subprocess.run(kandev("db", "init"), env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=120, check=False)
    if init.returncode != 0:
        raise SystemExit(f"kandev-es db init failed:\n{init.stderr}")
