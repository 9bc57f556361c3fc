"""AC-TASKS-EXTERNAL-ID-001.1: byte-exact collation ("C" on PostgreSQL, BINARY
on SQLite) is attested on the live schema before external-ID traffic is served;
a broken schema is refused with a typed 503 while anonymous creates go on."""

from __future__ import annotations

from kandev_es.api import create_app
from kandev_es.bootstrap import bootstrap
from tests.conftest import bearer

BREAK = {
    "sqlite": [
        "DROP INDEX identities_view_external_id",
        "CREATE UNIQUE INDEX identities_view_external_id"
        " ON identities_view (workspace_id, external_id COLLATE NOCASE)",
    ],
    "postgres": [
        "DROP INDEX identities_view_external_id",
        'ALTER TABLE identities_view ALTER COLUMN external_id TYPE text COLLATE "POSIX"',
        "CREATE UNIQUE INDEX identities_view_external_id"
        ' ON identities_view (workspace_id, external_id COLLATE "POSIX")',
    ],
}


def test_fresh_schema_is_attested(services):
    assert services.attestation.current.ok, services.attestation.current.problems


def test_broken_collation_refuses_external_id_traffic(backend, settings, services, workspace):
    secret, _ = services.tokens.issue(workspace_id=workspace.id, admin=False)
    with services.database.transaction() as tx:
        for statement in BREAK[backend]:
            tx.execute(statement)

    restarted = bootstrap(settings)  # a process starting on the broken schema
    try:
        assert not restarted.attestation.current.ok
        assert any("collation" in p for p in restarted.attestation.current.problems)
        client = create_app(services=restarted, run_projections=False).test_client()
        before = restarted.app.max_notification_id()

        refused = client.post(
            "/api/v1/tasks", json={"external_id": "E-1", "title": "t"}, headers=bearer(secret)
        )
        assert refused.status_code == 503
        assert refused.json["error"] == "schema_not_attested"
        lookup = client.get(
            f"/api/v1/workspaces/{workspace.id}/tasks/by-external-id",
            query_string={"external_id": "E-1"},
            headers=bearer(secret),
        )
        assert lookup.status_code == 503
        assert restarted.app.max_notification_id() == before

        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json["external_id_traffic"] == "refused"
        assert ready.json["schema_problems"]

        anonymous = client.post("/api/v1/tasks", json={"title": "t"}, headers=bearer(secret))
        assert anonymous.status_code == 200 and anonymous.json["outcome"] == "created"
    finally:
        restarted.close()


def test_readyz_reports_attested_schema_and_projection_lag(client):
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json["schema_attested"] is True
    assert {"tasks", "identities", "creations"} <= set(ready.json["projection_lag"])
