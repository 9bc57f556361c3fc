"""A failover seen from the pools: a node that turns read-only under the
service (what a demoted primary or a standby answers: SQLSTATE 25006 "cannot
execute ... in a read-only transaction") and sessions cut by the server (a
shutdown). Each is a typed 503 ``store_unavailable`` with Retry-After, never a
500; no connection to that node is used again (the pool is drained), and once
a writable node answers, creates succeed without a restart.

A real cluster of its own: ``ALTER SYSTEM SET default_transaction_read_only``
and a reload turn every open session read-only at once, as a demotion does."""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

psycopg = pytest.importorskip("psycopg")

from kandev_es.api import create_app  # noqa: E402
from kandev_es.bootstrap import Services, bootstrap  # noqa: E402
from kandev_es.config import Settings  # noqa: E402
from kandev_es.errors import StoreUnavailable  # noqa: E402
from tests.integration.helpers import create  # noqa: E402
from tests.support.postgres import Cluster, start_cluster  # noqa: E402

pytestmark = pytest.mark.postgres_only


@pytest.fixture(scope="module")
def node() -> Iterator[Cluster]:
    directory = Path(tempfile.mkdtemp(prefix="kandev-es-ro-"))
    cluster = start_cluster(directory / "pg")
    yield cluster
    cluster.stop()
    shutil.rmtree(directory, ignore_errors=True)


def _read_only(cluster: Cluster, on: bool) -> None:
    with psycopg.connect(cluster.url, autocommit=True) as admin:
        if on:
            admin.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        else:
            admin.execute("ALTER SYSTEM RESET default_transaction_read_only")
        admin.execute("SELECT pg_reload_conf()")
    # The postmaster has re-read the file once a new session sees it; it
    # signals the open sessions, which apply it before their next command.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with psycopg.connect(cluster.url, autocommit=True) as probe:
            row = probe.execute("SHOW default_transaction_read_only").fetchone()
        if row == ("on" if on else "off",):
            time.sleep(0.3)
            return
        time.sleep(0.05)
    raise AssertionError("the reload never took effect")


def _service_backends(cluster: Cluster) -> set[int]:
    with psycopg.connect(cluster.url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'"
            " AND pid <> pg_backend_pid()").fetchall()
    return {int(row[0]) for row in rows}


def _outcome(answer: Any) -> str:
    assert answer.status_code == 200, (answer.status_code, answer.get_json())
    return str(answer.get_json()["outcome"])


@pytest.fixture
def served(node: Cluster, tmp_path: Path) -> Iterator[tuple[Services, Any, str]]:
    schema = f"t_{uuid.uuid4().hex[:16]}"
    services = bootstrap(Settings(
        data_dir=tmp_path / "data", database_url=f"{node.url}?schema={schema}",
        runtime_in_process=False))
    workspace = services.workspaces.open("acme")
    secret, _ = services.tokens.issue(workspace_id=workspace.id, admin=False)
    client = create_app(services=services, run_projections=False).test_client()
    try:
        yield services, client, secret
    finally:
        _read_only(node, False)
        services.close()


def test_a_node_gone_read_only_answers_503_drops_its_connections_and_recovers(
    backend: str, node: Cluster, served: tuple[Services, Any, str]
) -> None:
    services, client, secret = served
    assert _outcome(create(client, secret, external_id="RO-1", title="t")) == "created"
    before = _service_backends(node)
    assert before

    _read_only(node, True)
    refused = create(client, secret, external_id="RO-2", title="t")
    assert refused.status_code == 503, refused.get_json()
    assert refused.get_json()["error"] == "store_unavailable"
    assert refused.headers["Retry-After"] == "1"
    # The event store's pool was drained: none of the sessions it had before
    # the refusal serves it again (a demoted node's sessions are not reused).
    pool: Any = services.app.recorder.datastore.pool  # type: ignore[attr-defined]
    with pool.connection() as connection:
        assert connection.info.backend_pid not in before

    # The read models' pool too: a write there is the same typed 503.
    with pytest.raises(StoreUnavailable), services.database.transaction() as tx:
        tx.execute("INSERT INTO feed_tasks VALUES (?, ?)", (str(uuid.uuid4()), "{}"))
    with services.database._pool.connection() as connection:  # type: ignore[attr-defined]
        assert connection.info.backend_pid not in before

    _read_only(node, False)
    assert _outcome(create(client, secret, external_id="RO-2", title="t")) == "created"
    assert _outcome(create(client, secret, external_id="RO-1", title="t")) == "found_settled"


def test_sessions_cut_by_the_server_are_retried_on_new_ones_never_a_500(
    backend: str, node: Cluster, served: tuple[Services, Any, str]
) -> None:
    _, client, secret = served
    assert _outcome(create(client, secret, external_id="CUT-1", title="t")) == "created"
    with psycopg.connect(node.url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()")
    answers = [create(client, secret, external_id=f"CUT-{n}", title="t").status_code
               for n in range(2, 6)]
    assert 500 not in answers
    assert answers[-1] == 200, answers
