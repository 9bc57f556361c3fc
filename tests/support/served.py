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
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from http.client import HTTPConnection, HTTPResponse
from pathlib import Path
from typing import Any

from kandev_es.bootstrap import bootstrap
from kandev_es.config import Settings, load_settings
from kandev_es.domain.agent_session import session_id_for

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 30.0
BIND_ATTEMPTS = 3
ADDRESS_IN_USE = "Address already in use"
TOKEN_RE = re.compile(r"admin token \(shown once\): (kes_\S+)")
WORKSPACE_RE = re.compile(r"workspace default = ([0-9a-f-]{36})")


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


def build_request(
    method: str,
    url: str,
    token: str | None = None,
    body: Any = None,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> urllib.request.Request:
    """A request with a bearer token and a JSON (or raw) body."""
    sent = dict(headers or {})
    if token:
        sent["Authorization"] = f"Bearer {token}"
    data = raw
    if body is not None:
        data = json.dumps(body).encode()
        sent.setdefault("Content-Type", "application/json")
    return urllib.request.Request(url, data=data, method=method, headers=sent)


def http(
    method: str,
    url: str,
    token: str | None = None,
    body: Any = None,
    raw: bytes | None = None,
    timeout: float = 20.0,
    headers: dict[str, str] | None = None,
) -> Reply:
    """One request; the body parsed as JSON when it is JSON, else the text."""
    request = build_request(method, url, token, body, raw, headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, text, got = response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        status, text, got = error.code, error.read(), dict(error.headers)
    parsed: Any = None
    if text:
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = text.decode("utf-8", errors="replace")
    return Reply(status, parsed, got)


class _StreamConnection(HTTPConnection):
    """A stream is sent without a length, so http.client hands the socket to
    the response: the connection keeps that response, since dropping it would
    close the socket and the server (which notices a client leaving at once)
    would end the stream; closing the connection closes the stream."""

    stream_response: HTTPResponse | None = None

    def close(self) -> None:
        if self.stream_response is not None:
            self.stream_response.close()
            self.stream_response = None
        super().close()


def open_event_stream(server: ServedProcess, token: str) -> tuple[HTTPConnection, int, dict]:
    """A workspace's SSE stream held open (up to two minutes) on a connection
    of its own: the connection, the status and the headers. A 200 has sent its
    first line (the stream really started); any other answer is read whole."""
    parts = urllib.parse.urlsplit(server.base)
    connection = _StreamConnection(parts.hostname, parts.port, timeout=20)
    connection.request(
        "GET",
        f"/api/v1/workspaces/{server.workspace_id}/events/stream?max_seconds=120",
        headers={"Authorization": f"Bearer {token}"},
    )
    response = connection.getresponse()
    if response.status == 200:
        assert response.readline().startswith(b"retry:")
        connection.stream_response = response
    else:
        response.read()
    return connection, response.status, dict(response.getheaders())


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


class Launched:
    """A `kandev-es` subcommand as a real process in its own process group,
    stdout and stderr in one log file, stopped as a group (SIGTERM, then
    SIGKILL): the one way tests start a served process."""

    def __init__(
        self,
        args: list[str],
        settings: Settings,
        log_path: Path,
        launcher: list[str] | None = None,
        **extra_env: str,
    ) -> None:
        self.stderr_path = log_path
        env = environment(settings, PYTHONUNBUFFERED="1", **extra_env)
        with self.stderr_path.open("wb") as log:
            self.process = subprocess.Popen(
                [*(launcher or kandev_command()), *args],
                env=env,
                cwd=log_path.parent,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # its own process group, stopped as one
            )

    def output(self) -> str:
        """Everything the process printed so far (stderr and stdout)."""
        return self.stderr_path.read_text(errors="replace")

    def log(self) -> str:
        return self.output()[-6000:]

    def wait_for_file(self, path: Path, what: str, seconds: float = 60.0) -> None:
        """Until ``path`` exists (something the process or its agent writes);
        failing, the assertion shows this process's log."""
        deadline = time.monotonic() + seconds
        while not path.exists():
            assert time.monotonic() < deadline, f"{what}:\n{self.log()}"
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=15)
        # Workers share the process group: none may outlive the test.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def __enter__(self) -> Launched:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ServedProcess(Launched):
    """`kandev-es serve` on a free port (or ``port``), ready when it answers
    /healthz. ``token`` is the admin token of a first start (None on a later
    start of the same data dir); ``workspace_id`` the `default` workspace."""

    def __init__(
        self,
        settings: Settings,
        log_dir: Path,
        workers: int | None = None,
        port: int | None = None,
        launcher: list[str] | None = None,
        **extra_env: str,
    ) -> None:
        self._earlier = ""
        attempts = 1 if port else BIND_ATTEMPTS
        for attempt in range(1, attempts + 1):
            self.port = port or free_port()
            self.base = f"http://127.0.0.1:{self.port}"
            args = ["serve", "--host", "127.0.0.1", "--port", str(self.port)]
            if workers is not None:
                args += ["--workers", str(workers)]
            super().__init__(
                args,
                settings,
                _fresh_log(log_dir, f"serve-{self.port}"),
                launcher,
                **{"KANDEV_PUBLIC_URL": self.base, **extra_env},
            )
            try:
                self.token, self.workspace_id = self._banner()
                self.wait_healthy()
                return
            except BaseException:
                self.stop()
                # The probed port was taken (by any process on this busy machine)
                # before gunicorn bound it: start again on another. What the
                # failed start printed (a first start's token) still counts.
                if attempt == attempts or ADDRESS_IN_USE not in super().output():
                    raise
                self._earlier = self.output()

    def output(self) -> str:
        """Everything this start printed, also on a port it then lost."""
        return self._earlier + super().output()

    @property
    def first_start(self) -> bool:
        """This start created the `default` workspace and printed an admin token."""
        return self.token is not None

    def _banner(self) -> tuple[str | None, str]:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            text = self.output()
            workspace = WORKSPACE_RE.search(text)
            if workspace and "Listening at" in text:
                token = TOKEN_RE.search(text)
                return (token.group(1) if token else None), workspace.group(1)
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError("server did not start:\n" + self.log())

    def start_agent_task(self, title: str) -> tuple[str, str]:
        """A task of the `default` workspace created with ``start_agent`` by the
        admin token: its id and its run id (its agent's ``KANDEV_RUN_ID``)."""
        created = http(
            "POST", self.base + "/api/v1/tasks", self.token,
            {"workspace_id": self.workspace_id, "title": title, "start_agent": True},
        )
        assert created.status == 200, created.body
        task_id = str(created.body["id"])
        return task_id, str(session_id_for(uuid.UUID(task_id)))

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if http("GET", self.base + "/healthz", timeout=2).status == 200:
                    return
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError("server not healthy:\n" + self.log())


class ConfServed(ServedProcess):
    """The production command (docs/operations.md: Production on PostgreSQL),
    `kandev-es db init && gunicorn -c http/gunicorn.conf.py 'kandev_es.api:create_app()'`
    (KANDEV_WORKERS=2 unless ``extra_env`` says otherwise): tables, a workspace and an admin
    token made with the CLI first, then gunicorn with our config."""

    def __init__(self, settings: Settings, log_dir: Path, **extra_env: str) -> None:
        self._earlier = ""
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {
            "KANDEV_BIND": f"127.0.0.1:{self.port}",
            "KANDEV_WORKERS": "2",
            "KANDEV_THREADS": "4",
            "KANDEV_PUBLIC_URL": self.base,
            **extra_env,
        }

        def cli(*args: str) -> dict[str, str]:
            done = subprocess.run(
                [*kandev_command(), *args], env=environment(settings, **env),
                capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            return json.loads(lines[-1]) if lines else {}

        cli("db", "init")
        # The workspace and the admin token as `kandev-es workspace create` and
        # `token create --admin` make them, in this process: two process starts
        # (their imports) less per launch; db init above is the command's own.
        store = bootstrap(load_settings(environment(settings, **env)))
        try:
            self.workspace_id = str(store.workspaces.open(f"conf-{self.port}").id)
            self.token, _ = store.tokens.issue(workspace_id=None, admin=True)
        finally:
            store.close()
        Launched.__init__(
            self,
            ["-c", str(ROOT / "http" / "gunicorn.conf.py"), "kandev_es.api:create_app()"],
            settings,
            _fresh_log(log_dir, f"gunicorn-{self.port}"),
            [sys.executable, "-m", "gunicorn"],
            **env,
        )
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise


class ServedMcp(Launched):
    """`kandev-es mcp --http` on a free port; ``url`` is its /mcp endpoint."""

    def __init__(self, settings: Settings, log_dir: Path, **extra_env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        args = ["mcp", "--http", "--host", "127.0.0.1", "--port", str(self.port)]
        super().__init__(args, settings, _fresh_log(log_dir, f"mcp-{self.port}"), **extra_env)
        try:
            self._wait_listening()
        except BaseException:
            self.stop()
            raise

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        raise AssertionError("mcp --http did not start listening:\n" + self.log())


def _fresh_log(log_dir: Path, stem: str) -> Path:
    """A log file no earlier process in this test wrote (a restart on the same port)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / f"{stem}.log"
    index = 1
    while path.exists():
        path = log_dir / f"{stem}-{index}.log"
        index += 1
    return path


def run_cli(settings: Settings, *args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*kandev_command(), *args],
        env=environment(settings, **extra_env),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
