"""A PostgreSQL restart does not strand the service: pooled connections killed
by the restart are replaced, the next create and Found succeed, and nothing
acknowledged before the restart is lost."""

from __future__ import annotations

from kandev_es.bootstrap import bootstrap
from kandev_es.config import Settings
from tests.support.postgres import start_cluster


def test_creates_and_founds_work_again_after_a_database_restart(tmp_path, cluster_dir):
    cluster = start_cluster(cluster_dir / "pg")
    services = None
    try:
        services = bootstrap(Settings(data_dir=tmp_path / "data", database_url=cluster.url))
        workspace = services.workspaces.open("restart")
        _, principal = services.tokens.issue(workspace_id=workspace.id, admin=False)
        before = services.creation.create(principal, {"external_id": "R-1", "title": "t"})
        assert before.outcome.value == "created"

        cluster.restart()

        found = services.creation.create(principal, {"external_id": "R-1", "title": "t"})
        assert found.outcome.value == "found_settled" and found.task["id"] == before.task["id"]
        fresh = services.creation.create(principal, {"external_id": "R-2", "title": "t"})
        assert fresh.outcome.value == "created"
        services.projections.catch_up()
        items = services.tasks.list(workspace.id).items
        assert [t["id"] for t in items] == [before.task["id"], fresh.task["id"]]
    finally:
        if services is not None:
            services.close()
        cluster.stop()
