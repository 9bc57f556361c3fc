"""One URL, one database, every connection (docs/operations.md "High availability"): a
formation's URL lists its nodes, and every connection the service opens -- the
event store's pool, the read models' pool, the projection leader's lock,
LISTEN, the CLI -- must reach the node the URL's libpq parameters choose.

Two real clusters: a read-only one (``default_transaction_read_only=on``, as a
standby answers ``target_session_attrs``) listed first, and the suite's own
cluster second. With ``target_session_attrs=read-write`` libpq skips the
first; a connection built from anything but the whole URL lands on the
read-only node, or on 127.0.0.1:5432, and the test fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

psycopg = pytest.importorskip("psycopg")

from kandev_es.projections.leadership import make_leadership  # noqa: E402
from kandev_es.projections.wakeup import make_waker  # noqa: E402
from psycopg.conninfo import conninfo_to_dict  # noqa: E402

from kandev_es.bootstrap import bootstrap  # noqa: E402
from kandev_es.config import Settings  # noqa: E402
from tests.conftest import postgres_admin_url  # noqa: E402
from tests.support.postgres import Cluster, start_cluster  # noqa: E402

pytestmark = pytest.mark.postgres_only


@pytest.fixture(scope="module")
def read_only_node() -> Iterator[Cluster]:
    # Not under pytest's tmp dir: concurrent pytest runs reset its parent to
    # 0700, which the postgres OS user cannot cross.
    directory = Path(tempfile.mkdtemp(prefix="kandev-es-ro-"))
    cluster = start_cluster(directory / "pg")
    with psycopg.connect(cluster.url, autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        admin.execute("SELECT pg_reload_conf()")
    yield cluster
    cluster.stop()
    shutil.rmtree(directory, ignore_errors=True)


def formation_url(read_only: Cluster, spelling: str, schema: str) -> str:
    primary = urlsplit(postgres_admin_url())
    if spelling == "host list":
        return (f"postgresql://postgres@127.0.0.1:{read_only.port},"
                f"127.0.0.1:{primary.port}/postgres?target_session_attrs=read-write"
                f"&schema={schema}")
    return (f"postgresql://postgres@/postgres?host=127.0.0.1,127.0.0.1"
            f"&port={read_only.port},{primary.port}&target_session_attrs=read-write"
            f"&schema={schema}")


def _server_port(connection: Any) -> int:
    row = connection.execute("SELECT current_setting('port') AS port").fetchone()
    return int(row["port"] if isinstance(row, dict) else row[0])


def _without_options(conninfo: str) -> dict[str, str]:
    params = conninfo_to_dict(conninfo)
    params.pop("options", None)
    return {key: str(value) for key, value in params.items()}


@pytest.fixture
def schema() -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:16]}"
    yield name
    with psycopg.connect(postgres_admin_url(), autocommit=True) as admin:
        admin.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.mark.parametrize("spelling", ["host list", "host and port parameters"])
def test_every_connection_reaches_the_read_write_node_the_url_chooses(
    backend: str, read_only_node: Cluster, schema: str, spelling: str, tmp_path: Path
) -> None:
    url = formation_url(read_only_node, spelling, schema)
    services = bootstrap(Settings(
        data_dir=tmp_path / "data", database_url=url, runtime_in_process=False))
    leadership: Any = make_leadership(services.database)
    waker: Any = make_waker(services.app, services.database)
    try:
        workspace = services.workspaces.open("acme")
        _, principal = services.tokens.issue(workspace_id=workspace.id, admin=False)
        created = services.creation.create(principal, {"external_id": "U-1", "title": "t"})
        assert created.outcome.value == "created"
        services.projections.catch_up()

        event_pool: Any = services.app.recorder.datastore.pool  # type: ignore[attr-defined]
        read_pool: Any = services.database._pool  # type: ignore[attr-defined]
        # Every connection string the service holds, same parameters (the read
        # models' pool adds only its search_path).
        conninfos = {
            "event store": event_pool.conninfo,
            "read models": read_pool.conninfo,
            "leader lock": leadership._url,
            "listener": waker._url,
        }
        expected = _without_options(services.settings.postgres.conninfo)  # type: ignore[union-attr]
        for name, conninfo in conninfos.items():
            assert _without_options(conninfo) == expected, name
        assert event_pool.kwargs == {"row_factory": psycopg.rows.dict_row}

        # And where each one really is.
        primary_port = urlsplit(postgres_admin_url()).port
        with event_pool.connection() as connection:
            assert _server_port(connection) == primary_port, "event store"
        with read_pool.connection() as connection:
            assert _server_port(connection) == primary_port, "read models"
        assert leadership.hold()
        assert _server_port(leadership._connection) == primary_port, "leader lock"
        listener = waker._connect()
        try:
            assert _server_port(listener) == primary_port, "listener"
        finally:
            listener.close()
        with psycopg.connect(postgres_admin_url()) as primary:
            tasks = primary.execute(
                f'SELECT count(*) FROM "{schema}".tasks_view').fetchone()[0]
        assert tasks == 1
        with psycopg.connect(read_only_node.url) as other:
            found = other.execute(
                "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
        assert found == (0,)
    finally:
        leadership.release()
        waker.close()
        services.close()


def _kandev_es(url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KANDEV_DATABASE_URL": url, "KANDEV_DATA_DIR": str(tmp_path / "data")}
    return subprocess.run(
        [str(Path(sys.executable).parent / "kandev-es"), *args],
        env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )


def test_db_init_takes_the_multi_host_url(
    backend: str, read_only_node: Cluster, schema: str, tmp_path: Path
) -> None:
    url = formation_url(read_only_node, "host list", schema)
    done = _kandev_es(url, tmp_path, "db", "init")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("initialised postgres")
    with psycopg.connect(postgres_admin_url()) as primary:
        found = primary.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    assert found == (1,)


def test_a_url_it_cannot_honour_exits_2_with_one_line_before_connecting(
    backend: str, schema: str, tmp_path: Path
) -> None:
    primary = urlsplit(postgres_admin_url())
    url = f"postgresql://postgres@127.0.0.1:{primary.port}/postgres?schema={schema}&bogus=1"
    for command in (("db", "init"), ("serve",)):
        done = _kandev_es(url, tmp_path, *command)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "KANDEV_DATABASE_URL" in lines[0], done.stderr
    with psycopg.connect(postgres_admin_url()) as admin:
        found = admin.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    assert found == (0,)
