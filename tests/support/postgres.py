"""Throwaway PostgreSQL clusters and databases for the test suite.

The cluster itself is managed by ``scripts/start-postgres`` (stdlib only, so
CI can run it before anything is installed); this module wraps it for
``tests/conftest.py`` and adds per-test database helpers built on psycopg 3.

Typical use::

    cluster = start_cluster(tmp_path_factory.mktemp("pg"))
    url = create_database(cluster.url, "kandev_gw0")
    ...
    drop_database(cluster.url, "kandev_gw0")
    cluster.stop()
"""

from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys
from dataclasses import dataclass
from importlib.machinery import SourceFileLoader
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
from psycopg import sql

REPO_ROOT = Path(__file__).resolve().parents[2]
START_POSTGRES = REPO_ROOT / "scripts" / "start-postgres"


class PostgresScriptError(RuntimeError):
    """``scripts/start-postgres`` failed; the message includes its stderr."""


def _run_script(*args: str) -> str:
    """Run scripts/start-postgres with ``args`` and return its stdout."""
    command = [sys.executable, str(START_POSTGRES), *args]
    result = subprocess.run(
        command,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise PostgresScriptError(
            f"{' '.join(command)} failed with exit code {result.returncode}:\n"
            f"{result.stderr.rstrip()}"
        )
    return result.stdout


def _parse_url(stdout: str) -> str:
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if len(lines) != 1 or not lines[0].startswith("postgresql://"):
        raise PostgresScriptError(
            f"expected one postgresql:// URL from {START_POSTGRES}, got: {stdout!r}"
        )
    return lines[0]


@dataclass
class Cluster:
    """A cluster started by ``scripts/start-postgres`` in ``directory``."""

    directory: Path
    url: str

    def stop(self) -> None:
        """Fast shutdown; a no-op if the cluster is not running."""
        _run_script("stop", "--dir", str(self.directory))

    def restart(self) -> None:
        """Stop, then start on the same port (existing connections are dropped)."""
        self.url = _parse_url(_run_script("restart", "--dir", str(self.directory)))

    @property
    def port(self) -> int:
        port = urlsplit(self.url).port
        assert port is not None, self.url
        return port

    def start(self) -> None:
        """Start a stopped cluster again on the same port, so ``url`` stays valid
        (pair with ``stop`` for a "database down for N seconds" window). Fails
        rather than moving if the port was taken meanwhile; a no-op if running."""
        url = _parse_url(
            _run_script("start", "--dir", str(self.directory), "--port", str(self.port))
        )
        if url != self.url:
            raise PostgresScriptError(f"cluster came back at {url}, not {self.url}")


def start_cluster(directory: Path) -> Cluster:
    """Start (initialising on first use) the cluster in ``directory``.

    If it is already running, the running cluster is returned.
    """
    directory = Path(directory).resolve()
    url = _parse_url(_run_script("start", "--dir", str(directory)))
    return Cluster(directory=directory, url=url)


@functools.cache
def postgres_program(name: str) -> str:
    """The path of a PostgreSQL program (``psql``, ``pg_dump``) of the
    installation scripts/start-postgres runs the test clusters with."""
    loader = SourceFileLoader("start_postgres", str(START_POSTGRES))
    spec = importlib.util.spec_from_loader("start_postgres", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return str(module.tool(module.require_bindir(), name))


def database_url(admin_url: str, name: str) -> str:
    """``admin_url`` with its database replaced by ``name``."""
    parts = urlsplit(admin_url)
    return urlunsplit(parts._replace(path="/" + quote(name, safe="")))


def create_database(admin_url: str, name: str) -> str:
    """(Re)create database ``name`` on the cluster at ``admin_url``; return its URL.

    An existing database of that name is dropped first.
    """
    drop_database(admin_url, name)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return database_url(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    """Drop database ``name`` if it exists, terminating its connections first."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        # WITH (FORCE) (PostgreSQL 13+) also covers connections that arrive
        # between the terminate above and the drop.
        force = sql.SQL(" WITH (FORCE)") if conn.info.server_version >= 130000 else sql.SQL("")
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}{}").format(sql.Identifier(name), force))
