"""The PostgreSQL runbook of docs/operations.md, run as written: every block
marked ``<!-- runbook: WHO -->`` on the page runs here, as WHO would run it, against
a real cluster of its own — the role and database made by a superuser, the service
user's environment file and password file (the role must give its password: the
cluster asks kandev for one), db init, the production command serving, token
rotation and a rebuild under a create load, WAL archiving, a base backup and a
point-in-time restore, then a dump restored elsewhere with the numbering moved
past what the dump lost. Only host names, ports, paths and the recovery moment are
moved to the test's own (each of those strings must still be on the page), so a
stale line fails here. The restore keeps every create acknowledged before the
moment and none after it, and `audit verify` is clean after each restore."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest

from tests.support.pages import ROOT, Block, blocks
from tests.support.postgres import database_url, postgres_program, start_cluster
from tests.support.served import free_port, http

PAGE = ROOT / "docs" / "operations.md"
MARKER = re.compile(r"<!-- runbook: ([\w-]+) -->")
PG_USER = "postgres"
MOMENT = "2026-12-05 10:00:00+00"
PAUSE_S = 0.05
DUMP_TARGET = "kandev_new"

pytestmark = pytest.mark.timeout(600)


class Runbook:
    """The page's runbook blocks, each to be run once, with the page's host, port
    and paths moved into ``tmp``."""

    def __init__(self, tmp: Path, port: int) -> None:
        self.tmp = tmp
        self.pg_host = tmp / "pg-host"
        self.cluster_dir = self.pg_host / "cluster"
        self.etc = tmp / "etc-kandev-es"
        self.moves = {
            "-h db.internal -p 5432": f"-h 127.0.0.1 -p {port}",
            # The dump's restore target: another database of the same cluster.
            "db-new:5432/kandev": f"127.0.0.1:{port}/{DUMP_TARGET}",
            "db-new:5432": f"127.0.0.1:{port}",
            "db.internal:5432": f"127.0.0.1:{port}",
            "/etc/kandev-es/": f"{self.etc}/",
            "/var/lib/kandev-es": str(tmp / "kandev-data"),
            "/var/lib/postgresql/wal-archive": str(self.pg_host / "wal-archive"),
            "/var/backups/postgresql/": f"{self.pg_host}/backups/",
            "/var/lib/postgresql/15/main": str(self.cluster_dir / "data"),
        }
        self.used: set[str] = set()
        self.blocks = [b for b in blocks(PAGE) if MARKER.fullmatch(b.marker)]
        self.ran: set[int] = set()
        self.etc.mkdir()

    def find(self, line: str) -> Block:
        found = [b for b in self.blocks if line in b.text]
        assert len(found) == 1, f"{len(found)} runbook blocks of {PAGE.name} hold {line!r}"
        return found[0]

    def text(self, block: Block, **more: str) -> str:
        text = block.text
        for old, new in {**self.moves, **more}.items():
            if old in text:
                self.used.add(old)
                text = text.replace(old, new)
        self.ran.add(block.line)
        return text

    def run(self, line: str, env: dict[str, str] | None = None, **more: str) -> str:
        """The block holding ``line``, run as its marker says; its stdout."""
        block = self.find(line)
        who = MARKER.fullmatch(block.marker).group(1)  # type: ignore[union-attr]
        text = self.text(block, **more)
        where = f"{PAGE.name}:{block.line} ({who})"
        if who == "superuser":
            command = [postgres_program("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
                       "-d", self.admin_url, "-f", "-"]
            done = subprocess.run(command, input=text, capture_output=True, text=True,
                                  timeout=60)
        else:
            command = ["bash", "-e", "-o", "pipefail", "-c", text]
            cwd = self.tmp
            if who == "postgres-host":
                cwd = self.pg_host
                if os.geteuid() == 0:
                    command = ["runuser", "-u", PG_USER, "--", *command]
            done = subprocess.run(command, cwd=cwd, env=env or self.env(), capture_output=True,
                                  text=True, timeout=300, stdin=subprocess.DEVNULL)
        output = f"{done.stdout}\n{done.stderr}"
        assert done.returncode == 0, f"{where}: exit {done.returncode}\n{output}"
        return done.stdout

    def env(self, **extra: str) -> dict[str, str]:
        """A login shell's environment: no KANDEV_ or PG setting, the venv and
        PostgreSQL's programs on PATH."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KANDEV_", "PG"))}
        bindir = Path(postgres_program("psql")).parent
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), str(bindir),
                                       env.get("PATH", "")])
        env.update(extra)
        return env

    def service_env(self) -> dict[str, str]:
        """What systemd's EnvironmentFile gives the service: the env file's lines."""
        lines = (self.etc / "env").read_text().splitlines()
        return self.env(**dict(line.split("=", 1) for line in lines if "=" in line))

    admin_url = ""


def _as_postgres(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(path, PG_USER, PG_USER)


def _ask_kandev_for_its_password(data: Path, admin_url: str) -> None:
    """The test cluster trusts everyone; production asks the role for its password."""
    hba = data / "pg_hba.conf"
    hba.write_text("host all kandev 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
    with psycopg.connect(admin_url, autocommit=True) as connection:
        connection.execute("SELECT pg_reload_conf()")


class Load:
    """Creates with distinct external IDs until stopped; the acknowledged ones."""

    def __init__(self, base: str, token: str, workspace: str, prefix: str) -> None:
        self.acknowledged: list[str] = []
        self.failures: list[object] = []
        self._stop = threading.Event()
        self._args = (base, token, workspace, prefix)
        self._threads = [threading.Thread(target=self._run, args=(n,)) for n in range(2)]
        for thread in self._threads:
            thread.start()

    def _run(self, worker: int) -> None:
        base, token, workspace, prefix = self._args
        count = 0
        while not self._stop.is_set():
            external_id = f"{prefix}-{worker}-{count}"
            count += 1
            answer = http("POST", base + "/api/v1/tasks", token,
                          {"workspace_id": workspace, "title": "t", "external_id": external_id})
            if answer.status == 200 and answer.body["outcome"] == "created":
                self.acknowledged.append(external_id)
            else:
                self.failures.append((answer.status, answer.body))
            self._stop.wait(PAUSE_S)  # a steady load, not a flood: the rebuild replays it all

    def stop(self) -> list[str]:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)
        assert not self.failures, self.failures[:3]
        return self.acknowledged


def _serve(runbook: Runbook, port: int) -> subprocess.Popen[bytes]:
    """The production command of the page, as the unit runs it (from the clone,
    with the environment file's settings)."""
    text = runbook.text(_serve_block(runbook))
    env = runbook.service_env()
    env.update(KANDEV_BIND=f"127.0.0.1:{port}", KANDEV_WORKERS="2", KANDEV_THREADS="4")
    log = (runbook.tmp / "serve.log").open("wb")
    return subprocess.Popen(["bash", "-e", "-c", text], cwd=ROOT, env=env, stdout=log,
                            stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)


def _serve_block(runbook: Runbook) -> Block:
    found = [b for b in runbook.blocks if b.marker == "<!-- runbook: serve -->"]
    assert len(found) == 1, "one production command marked <!-- runbook: serve -->"
    return found[0]


def _healthy(base: str, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert server.poll() is None, log.read_text()
        with contextlib.suppress(OSError):
            if http("GET", base + "/readyz", timeout=2).status == 200:
                return
        time.sleep(0.1)
    raise AssertionError("the production command did not get ready:\n" + log.read_text())


def _stop(server: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(server.pid, signal.SIGKILL)


def _archived(admin_url: str, archive: Path) -> None:
    """Switch to a new WAL segment and wait until the finished one is archived."""
    with psycopg.connect(admin_url, autocommit=True) as connection:
        row = connection.execute("SELECT pg_walfile_name(pg_switch_wal())").fetchone()
    assert row is not None
    deadline = time.monotonic() + 60
    while not (archive / row[0]).exists():
        assert time.monotonic() < deadline, f"{row[0]} never reached the archive"
        time.sleep(0.1)


def _until_writable(admin_url: str) -> None:
    deadline = time.monotonic() + 120
    while True:
        with contextlib.suppress(psycopg.OperationalError), psycopg.connect(admin_url) as c:
            row = c.execute("SELECT pg_is_in_recovery()").fetchone()
            if row == (False,):
                return
        assert time.monotonic() < deadline, "the restored cluster never left recovery"
        time.sleep(0.2)


def _held(kandev_url: str, workspace: str) -> set[str]:
    """The external IDs the restored store's tasks hold (its read model, which
    `audit verify` has just found in agreement with the events)."""
    with psycopg.connect(kandev_url) as connection:
        rows = connection.execute(
            "SELECT external_id FROM tasks_view WHERE workspace_id = %s", (workspace,)
        ).fetchall()
    return {row[0] for row in rows}


def test_the_postgresql_runbook_runs_as_written(cluster_dir):
    tmp_path = cluster_dir  # the cluster's, the service user's and the backups' (conftest)
    pg_host = tmp_path / "pg-host"
    _as_postgres(pg_host)
    _as_postgres(pg_host / "backups")
    cluster = start_cluster(pg_host / "cluster")
    runbook = Runbook(tmp_path, cluster.port)
    runbook.admin_url = cluster.url
    server = None
    try:
        _ask_kandev_for_its_password(runbook.cluster_dir / "data", cluster.url)
        runbook.run("CREATE ROLE kandev")
        runbook.run("install -d -m 0700 /var/lib/postgresql/wal-archive")
        runbook.run("archive_mode = 'on'")
        cluster.restart()  # systemctl restart postgresql: archive mode takes effect

        runbook.run("cat > /etc/kandev-es/env")
        setup = runbook.run("kandev-es workspace create payments")
        assert "durability unknown" not in setup  # the grant is in the role's SQL
        workspace, admin, member = [json.loads(x) for x in setup.splitlines() if x[:1] == "{"]
        assert {"id", "token"} <= set(member)  # the id rotation needs, with the secret

        port = free_port()
        base = f"http://127.0.0.1:{port}"
        server = _serve(runbook, port)
        _healthy(base, server, tmp_path / "serve.log")
        runbook.run("pg_basebackup")

        load = Load(base, admin["token"], workspace["id"], "RB")
        rotated = runbook.run("token revoke", env=runbook.env(OLD_TOKEN_ID=member["id"]))
        new = json.loads(rotated.splitlines()[0])["token"]
        own = f"{base}/api/v1/workspaces/{workspace['id']}"
        assert http("GET", own, member["token"]).status == 404  # refused from now on
        assert http("GET", own, new).status == 200
        runbook.run("kandev-es projections rebuild")
        with psycopg.connect(database_url(cluster.url, "kandev")) as connection:
            row = connection.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = 'kandev'"
            ).fetchone()
        # the page's bound: 2 workers and the background process
        assert row is not None and row[0] <= 2 * 15 + 19 + 4, row
        before = load.stop()
        assert len(before) >= 10, before

        time.sleep(0.05)
        moment = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f+00")
        time.sleep(0.05)
        after = Load(base, admin["token"], workspace["id"], "LATE")
        time.sleep(0.5)
        late = after.stop()
        assert late
        _archived(cluster.url, pg_host / "wal-archive")
        _stop(server)
        server = None
        cluster.stop()

        runbook.run("recovery.signal", **{MOMENT: moment})
        cluster.start()
        _until_writable(cluster.url)
        runbook.run("kandev-es db init\nkandev-es audit verify")
        kandev_url = database_url(cluster.url, "kandev")
        held = _held(kandev_url, workspace["id"])
        assert held == set(before), (len(held), len(before), len(late))

        with psycopg.connect(cluster.url, autocommit=True) as connection:  # the new server's
            connection.execute(f"CREATE DATABASE {DUMP_TARGET} OWNER kandev")
        dumped = runbook.run("pg_dump -Fc")
        [moved] = [json.loads(x) for x in dumped.splitlines() if x[:1] == "{"]
        assert moved["name"] == "payments"
        assert int(moved["next_identifier_at_least"].split("-")[1]) > 1000 + len(before)
        assert _held(database_url(cluster.url, DUMP_TARGET), workspace["id"]) == set(before)
    finally:
        if server is not None:
            _stop(server)
        cluster.stop()
    assert runbook.ran == {b.line for b in runbook.blocks}, "a runbook block was not run"
    assert {*runbook.moves, MOMENT} <= runbook.used, set(runbook.moves) - runbook.used
