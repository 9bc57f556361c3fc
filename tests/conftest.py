"""Test wiring: one parametrised backend fixture (SQLite and PostgreSQL).

PostgreSQL is real: the controlling pytest process starts one throwaway cluster
with scripts/start-postgres (unless KANDEV_TEST_DATABASE_URL names one, as
.ci/run does), and every test gets its own schema in it. xdist workers inherit
the URL through the environment.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kandev_es.bootstrap import Services, bootstrap
from kandev_es.config import Settings

PG_ENV = "KANDEV_TEST_DATABASE_URL"
_started_cluster: Any = None


def pytest_configure(config: pytest.Config) -> None:
    global _started_cluster
    if hasattr(config, "workerinput") or os.environ.get(PG_ENV):
        return
    from tests.support.postgres import start_cluster

    directory = Path(tempfile.mkdtemp(prefix="kandev-es-pg-"))
    _started_cluster = start_cluster(directory / "pg")
    os.environ[PG_ENV] = _started_cluster.url


def pytest_unconfigure(config: pytest.Config) -> None:
    if _started_cluster is not None and not hasattr(config, "workerinput"):
        _started_cluster.stop()


def postgres_admin_url() -> str:
    return os.environ[PG_ENV]


def _drop_schema(schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(postgres_admin_url(), autocommit=True) as connection:
        statement = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
        connection.execute(statement)


@pytest.fixture
def cluster_dir() -> Iterator[Path]:
    """A directory for a test's own PostgreSQL cluster, outside pytest's
    basetemp: the cluster runs as the postgres OS user, which must enter every
    ancestor of its directory (scripts/start-postgres grants o+x on them), and
    any other pytest session starting on the machine sets /tmp/pytest-of-root
    back to 0700, after which initdb, a restart or a base backup there fails
    with "Permission denied". Removed after the test."""
    directory = Path(tempfile.mkdtemp(prefix="kandev-es-cluster-"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def anyio_backend() -> str:
    """The MCP tests' async tests run on asyncio (anyio would also try trio)."""
    return "asyncio"


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    marker = request.node.get_closest_marker("postgres_only")
    if marker is not None and request.param != "postgres":
        pytest.skip("PostgreSQL-only behaviour")
    return str(request.param)


@pytest.fixture
def settings(backend: str, tmp_path: Path) -> Iterator[Settings]:
    if backend == "sqlite":
        yield Settings(data_dir=tmp_path / "data", repository_roots=(tmp_path,))
        return
    schema = f"t_{uuid.uuid4().hex[:16]}"
    separator = "&" if "?" in postgres_admin_url() else "?"
    url = f"{postgres_admin_url()}{separator}schema={schema}"
    yield Settings(data_dir=tmp_path / "data", database_url=url, repository_roots=(tmp_path,))
    _drop_schema(schema)


@pytest.fixture
def services(settings: Settings) -> Iterator[Services]:
    svc = bootstrap(settings)
    yield svc
    svc.close()


@pytest.fixture
def workspace(services: Services) -> Any:
    return services.workspaces.open("acme")


@pytest.fixture
def member(services: Services, workspace: Any) -> Any:
    """A member of the workspace (the default role) and its bearer secret."""
    secret, principal = services.tokens.issue(workspace_id=workspace.id, admin=False)
    return principal, secret


@pytest.fixture
def operator(services: Services, workspace: Any) -> Any:
    """An operator of the workspace (release, repositories, policy, deletion)."""
    secret, principal = services.tokens.issue(
        workspace_id=workspace.id, admin=False, role="operator"
    )
    return principal, secret


@pytest.fixture
def admin(services: Services) -> Any:
    secret, principal = services.tokens.issue(workspace_id=None, admin=True)
    return principal, secret


@pytest.fixture
def client(services: Services) -> Any:
    from kandev_es.api import create_app

    return create_app(services=services, run_projections=False).test_client()


@pytest.fixture
def cli(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``kandev-es`` run in-process on the test's store (click's runner)."""
    from click.testing import CliRunner

    from kandev_es.cli import main

    monkeypatch.setenv("KANDEV_DATA_DIR", str(settings.data_dir))
    if settings.database_url:
        monkeypatch.setenv("KANDEV_DATABASE_URL", settings.database_url)
    else:
        monkeypatch.delenv("KANDEV_DATABASE_URL", raising=False)
    runner = CliRunner()

    def run(*args: str) -> Any:
        return runner.invoke(main, list(args), catch_exceptions=False)

    return run


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}
