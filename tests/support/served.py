"""A real `kandev-es serve` process with extra environment (failpoints, short
leases), spoken to over HTTP with the stdlib. Every wait is bounded."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kandev_es.config import Settings

WAIT_S = 30.0
TOKEN_RE = re.compile(r"admin token \(shown once\): (kes_\S+)")
WORKSPACE_RE = re.compile(r"workspace default = ([0-9a-f-]{36})")


@dataclass
class Reply:
    status: int
    body: Any


def build_request(
    method: str, url: str, token: str | None = None, body: Any = None, raw: bytes | None = None
) -> urllib.request.Request:
    """A request with a bearer token and a JSON (or raw) body."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = raw
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    return urllib.request.Request(url, data=data, method=method, headers=headers)


def http(
    method: str,
    url: str,
    token: str | None = None,
    body: Any = None,
    raw: bytes | None = None,
    timeout: float = 20.0,
) -> Reply:
    request = build_request(method, url, token, body, raw)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, text = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, text = error.code, error.read()
    return Reply(status, json.loads(text) if text else None)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def kandev_command() -> list[str]:
    script = Path(sys.executable).parent / "kandev-es"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "from kandev_es.cli import main; main()"]


def environment(settings: Settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KANDEV_")}
    env["KANDEV_DATA_DIR"] = str(settings.data_dir)
    if settings.database_url:
        env["KANDEV_DATABASE_URL"] = settings.database_url
    if settings.repository_roots:
        env["KANDEV_REPOSITORY_ROOTS"] = ":".join(map(str, settings.repository_roots))
    env.update(extra)
    return env


class ServedProcess:
    def __init__(
        self,
        settings: Settings,
        log_dir: Path,
        workers: int | None = None,
        port: int | None = None,
        launcher: list[str] | None = None,
        **extra_env: str,
    ) -> None:
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.stderr_path = log_dir / f"serve-{self.port}.log"
        env = environment(settings, KANDEV_PUBLIC_URL=self.base, **extra_env)
        command = [*(launcher or kandev_command()), "serve", "--port", str(self.port)]
        if workers is not None:
            command += ["--workers", str(workers)]
        with self.stderr_path.open("wb") as log:
            self.process = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        self.token, self.workspace_id = self._banner()
        self.wait_healthy()

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-6000:]

    def _banner(self) -> tuple[str | None, str]:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            text = self.log()
            workspace = WORKSPACE_RE.search(text)
            if workspace and "Listening at" in text:
                token = TOKEN_RE.search(text)
                return (token.group(1) if token else None), workspace.group(1)
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError("server did not start:\n" + self.log())

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if http("GET", self.base + "/healthz", timeout=2).status == 200:
                    return
            time.sleep(0.1)
        raise AssertionError("server not healthy:\n" + self.log())

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=15)


def run_cli(settings: Settings, *args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*kandev_command(), *args],
        env=environment(settings, **extra_env),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
