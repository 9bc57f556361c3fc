"""``kandev-es db init`` upgrades an event store made by the previous release
(table lock, no ``transaction_id`` column) in place: every event and every
projection position is kept, and the projections go on from where they were,
without replaying or skipping anything (docs/architecture.md: Ordering without a global lock)."""

from __future__ import annotations

import subprocess
from typing import Any

import psycopg
import pytest
from psycopg import sql

from kandev_es.api import create_app
from kandev_es.bootstrap import bootstrap
from kandev_es.services.audit import verify_tasks
from tests.conftest import postgres_admin_url
from tests.integration.helpers import TASK_CREATED_SOURCES, create
from tests.support.served import environment, kandev_command

# kandev_insert_events as the previous release installed it (commit b736e23).
OLD_INSERT_FUNCTION = (
    "CREATE OR REPLACE FUNCTION {schema}.kandev_insert_events("
    "ids uuid[], versions bigint[], topics text[], states bytea[],"
    " guard_ids uuid[], guard_versions bigint[])"
    " RETURNS SETOF bigint LANGUAGE plpgsql AS $BODY$"
    " BEGIN"
    "  LOCK TABLE {table} IN EXCLUSIVE MODE;"
    "  FOR i IN 1 .. coalesce(array_length(guard_ids, 1), 0) LOOP"
    "   IF EXISTS (SELECT 1 FROM {table} WHERE originator_id = guard_ids[i]"
    "    AND originator_version > guard_versions[i]) THEN RETURN; END IF;"
    "  END LOOP;"
    "  NOTIFY {channel};"
    "  RETURN QUERY INSERT INTO {table}"
    "   (originator_id, originator_version, topic, state)"
    "   SELECT * FROM unnest(ids, versions, topics, states)"
    "   RETURNING notification_id;"
    " END $BODY$"
)


def _connect() -> psycopg.Connection[Any]:
    return psycopg.connect(postgres_admin_url(), autocommit=True)


def _downgrade(schema: str, table_name: str, channel: str) -> None:
    """Give the store exactly the shape the previous release made."""
    table = sql.Identifier(schema, table_name)
    with _connect() as conn:
        sequence = conn.execute(
            "SELECT pg_get_serial_sequence(%s, 'notification_id')",
            (f'"{schema}"."{table_name}"',),
        ).fetchone()
        assert sequence is not None
        conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN transaction_id").format(table))
        conn.execute(
            sql.SQL("ALTER TABLE {} ALTER COLUMN notification_id SET DEFAULT nextval({})").format(
                table, sql.Literal(sequence[0])
            )
        )
        conn.execute(
            sql.SQL(OLD_INSERT_FUNCTION).format(
                schema=sql.Identifier(schema), table=table, channel=sql.Identifier(channel)
            )
        )


def _columns(schema: str, table_name: str) -> set[str]:
    with _connect() as conn:
        rows = conn.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema = %s AND table_name = %s",
            (schema, table_name),
        ).fetchall()
    return {row[0] for row in rows}


def _snapshot(schema: str, table_name: str) -> dict[str, list[tuple[Any, ...]]]:
    with _connect() as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        events = conn.execute(
            sql.SQL(
                "SELECT notification_id, originator_id, originator_version, topic, state"
                " FROM {} ORDER BY notification_id"
            ).format(sql.Identifier(table_name))
        ).fetchall()
        tracking = conn.execute(
            "SELECT name, position FROM projection_tracking ORDER BY name"
        ).fetchall()
        feed = conn.execute(
            "SELECT position, event_id, type, subject FROM feed_events ORDER BY position"
        ).fetchall()
    return {"events": events, "tracking": tracking, "feed": feed}


@pytest.mark.postgres_only
def test_db_init_upgrades_an_old_store_keeping_events_and_positions(settings) -> None:
    services = bootstrap(settings)
    recorder: Any = services.app.recorder
    schema, table_name = recorder.datastore.schema, recorder.events_table_name
    try:
        client = create_app(services=services, run_projections=False).test_client()
        workspace = services.workspaces.open("acme")
        secret, _ = services.tokens.issue(workspace_id=workspace.id, admin=False)
        made = [create(client, secret, external_id=f"U-{i}", title=f"t{i}").json for i in range(4)]
        services.projections.catch_up()
    finally:
        services.close()
    _downgrade(schema, table_name, recorder.channel_name)
    services = bootstrap(settings.with_overrides(create_tables=False))
    try:
        # Written by the old insert function into the old table: not projected yet.
        client = create_app(services=services, run_projections=False).test_client()
        made += [create(client, secret, external_id=f"U-{i}", title=f"t{i}").json for i in (4, 5)]
    finally:
        services.close()
    assert all(task["outcome"] == "created" for task in made)
    assert "transaction_id" not in _columns(schema, table_name)
    before = _snapshot(schema, table_name)

    upgrade = subprocess.run(
        [*kandev_command(), "db", "init"],
        env=environment(settings),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert upgrade.returncode == 0, upgrade.stderr
    assert "transaction_id" in _columns(schema, table_name)
    assert _snapshot(schema, table_name) == before  # every event, position and feed row
    with _connect() as conn:
        old_ids = conn.execute(
            sql.SQL("SELECT DISTINCT transaction_id::text FROM {}").format(
                sql.Identifier(schema, table_name)
            )
        ).fetchall()
    assert old_ids == [("0",)]

    services = bootstrap(settings.with_overrides(create_tables=False))
    try:
        client = create_app(services=services, run_projections=False).test_client()
        made += [create(client, secret, external_id=f"U-{i}", title=f"t{i}").json for i in (6, 7)]
        assert create(client, secret, external_id="U-0", title="again").json["outcome"] == (
            "found_settled"
        )
        services.projections.catch_up()
        after = _snapshot(schema, table_name)
        assert after["events"][: len(before["events"])] == before["events"]
        assert after["feed"][: len(before["feed"])] == before["feed"]  # nothing replayed
        created = [row for row in after["feed"] if row[2] == "task.created"]
        assert sorted(str(row[3]) for row in created) == sorted(t["id"] for t in made)
        activated = {
            row[0] for row in after["events"] if str(row[3]).endswith(TASK_CREATED_SOURCES)
        }
        assert {row[0] for row in created} == activated  # feed ids are notification ids
        head = after["events"][-1][0]
        assert all(position == head for _, position in after["tracking"])
        report = verify_tasks(services.app, services.database)
        assert report.ok and report.streams == len(made), report.to_dict()
    finally:
        services.close()


@pytest.mark.postgres_only
def test_events_restored_with_another_clusters_transaction_ids_are_all_read(services) -> None:
    """A logical restore (pg_dump into another cluster) keeps the stored
    transaction ids of the old cluster, far above the new one's: readers must
    still see every event, so none filters on that column."""
    recorder: Any = services.app.recorder
    workspace = services.workspaces.open("restored")
    secret, _ = services.tokens.issue(workspace_id=workspace.id, admin=False)
    client = create_app(services=services, run_projections=False).test_client()
    made = [create(client, secret, external_id=f"R-{i}", title=f"r{i}").json for i in range(3)]
    with _connect() as conn:
        conn.execute(
            sql.SQL("UPDATE {} SET transaction_id = '900000000000'::xid8").format(
                sql.Identifier(recorder.datastore.schema, recorder.events_table_name)
            )
        )
    services.projections.catch_up()
    report = verify_tasks(services.app, services.database)
    assert report.ok and report.streams == len(made), report.to_dict()
