"""Forgetting a task (issue 47; docs/auditing.md: Erasure), on both backends:
its free text is gone from every read, read model and feed row; the stored
events stay byte for byte; the identity, lookup, release and a rebuild all
still work; and after the documented VACUUM steps the erased marker is found
nowhere in the store (the SQLite files; PostgreSQL's dump and table files)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import uuid
from pathlib import Path

from kandev_es.domain.task import Task
from kandev_es.services.ledger_audit import describe, verify_ledger
from projections.rebuild import rebuild
from tests.conftest import bearer, postgres_admin_url
from tests.integration.helpers import create
from tests.integration.test_ledger import keyring, logged
from tests.support.postgres import postgres_program

MARKER = "Zebra-Marker-4711"


def forget(client, secret, task_id, key="erase-1", reason="GDPR art. 17 request 118"):
    return client.post(
        f"/api/v1/tasks/{task_id}/forget",
        json={"reason": reason},
        headers={**bearer(secret), "Idempotency-Key": key},
    )


def all_stored(services):
    return [
        (n.id, n.topic, bytes(n.state))
        for n in services.app.recorder.select_notifications(
            start=0, limit=100_000, inclusive_of_start=False
        )
    ]


def read_side(services, workspace, client, secret):
    services.projections.catch_up()
    with services.database.transaction() as tx:
        feed = [
            tuple(map(str, row))
            for row in tx.execute(
                "SELECT position, event_id, type, subject, timestamp, data FROM feed_events"
                " ORDER BY position"
            )
        ]
        tasks = [
            tuple(map(str, row))
            for row in tx.execute("SELECT task_id, revision, dto FROM tasks_view ORDER BY task_id")
        ]
    listed = client.get(f"/api/v1/workspaces/{workspace.id}/tasks", headers=bearer(secret)).json
    return feed, tasks, listed


def forgotten_task(client, services, member, operator):
    """A task holding the marker in its title, description and an edit, forgotten."""
    made = create(
        client,
        member[1],
        external_id="ERASE-F",
        title=f"{MARKER} title",
        description=f"{MARKER} description",
    )
    assert made.status_code == 200, made.json
    task_id = made.json["id"]
    edit = client.patch(
        f"/api/v1/tasks/{task_id}",
        json={"description": f"{MARKER} again"},
        headers=bearer(member[1]),
    )
    assert edit.status_code == 200, edit.json
    before = all_stored(services)
    answer = forget(client, operator[1], task_id)
    assert answer.status_code == 200, answer.json
    assert answer.headers["Idempotent-Replayed"] == "false"
    assert answer.json["forgotten"] is True and answer.json["actor"].startswith("token:")
    return task_id, before


def test_a_forgotten_task_reads_forgotten_everywhere_and_its_events_are_unchanged(
    client, services, workspace, member, operator
):
    task_id, before = forgotten_task(client, services, member, operator)
    after = all_stored(services)
    assert after[: len(before)] == before  # every stored byte as it was
    added = [topic.rsplit(".", 1)[-1] for _, topic, _ in after[len(before) :]]
    assert sorted(added) == ["Forgotten", "Forgotten"]  # the task's and its identity's
    assert all(MARKER.encode() not in state for _, _, state in after)

    got = client.get(f"/api/v1/tasks/{task_id}", headers=bearer(member[1]))
    assert (got.json["title"], got.json["description"], got.json["forgotten"]) == (None, None, True)
    feed, tasks, listed = read_side(services, workspace, client, member[1])
    assert MARKER not in repr((feed, tasks, listed))
    assert feed[-1][2] == "task.updated" and '"forgotten": true' in feed[-1][5]
    events = client.get(f"/api/v1/workspaces/{workspace.id}/events", headers=bearer(member[1]))
    assert events.status_code == 200 and MARKER not in events.get_data(as_text=True)

    # The identity keeps working: a retry is Found, its free text shown as forgotten.
    again = create(client, member[1], external_id="ERASE-F", title="new words")
    assert again.status_code == 200 and again.json["id"] == task_id
    assert (again.json["title"], again.json.get("forgotten")) == (None, True)
    refused = client.patch(
        f"/api/v1/tasks/{task_id}", json={"title": "x"}, headers=bearer(member[1])
    )
    assert refused.status_code == 409 and refused.json["error"] == "task_forgotten"


def test_forget_is_idempotent_operator_only_and_typed(
    client, services, workspace, member, operator
):
    task_id, _ = forgotten_task(client, services, member, operator)
    replay = forget(client, operator[1], task_id, key="erase-2")
    assert replay.status_code == 200 and replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json["operation_id"] == "erase-1"
    other = create(client, member[1], title="kept").json["id"]
    stored = all_stored(services)
    assert forget(client, member[1], other).status_code == 403
    no_key = client.post(
        f"/api/v1/tasks/{other}/forget", json={"reason": "r"}, headers=bearer(operator[1])
    )
    assert no_key.status_code == 400 and no_key.json["error"] == "idempotency_key_required"
    assert forget(client, operator[1], other, reason=" ").status_code == 422
    assert forget(client, operator[1], uuid.uuid4()).status_code == 404
    assert all_stored(services) == stored  # nothing written by a refusal


def test_release_history_and_rebuild_work_on_a_forgotten_task(
    client, services, workspace, member, operator, cli
):
    task_id, _ = forgotten_task(client, services, member, operator)
    history = cli(
        "identity",
        "history",
        "--workspace",
        str(workspace.id),
        "--external-id",
        "ERASE-F",
        "--json",
    )
    assert history.exit_code == 0, history.output
    assert MARKER not in history.output and "Forgotten" in history.output
    released = client.delete(
        f"/api/v1/workspaces/{workspace.id}/tasks/by-external-id?external_id=ERASE-F",
        headers={**bearer(operator[1]), "Idempotency-Key": "rel-1"},
    )
    assert released.status_code == 200, released.json
    assert released.json["title"] is None
    # The release's stored answer (its free text null) made the task no new
    # data key: the audit still finds the forgotten task's key gone.
    with services.database.transaction() as tx:
        assert tx.execute("SELECT task_id FROM task_keys") == []
    logged(services, workspace, member)
    audited = verify_ledger(services.app, services.database, keyring(services))
    assert audited.ok, describe(audited)
    live = read_side(services, workspace, client, member[1])
    for name in ("tasks", "identities", "feeds"):
        rebuild(services.projections, name, batch_size=3)
    assert read_side(services, workspace, client, member[1]) == live
    assert services.app.load(uuid.UUID(task_id), Task).title is None


def test_the_marker_is_nowhere_in_the_store_after_the_documented_steps(
    client, services, settings, workspace, member, operator
):
    forgotten_task(client, services, member, operator)
    services.close()
    nowhere_in_store(settings)


def nowhere_in_store(settings, marker=MARKER):
    """After the documented steps (docs/operations.md: Erasure) ``marker`` is
    in no file of the SQLite data dir, nor in PostgreSQL's dump of the schema
    or its table files (the store's services closed first)."""
    if settings.postgres is None:
        with sqlite3.connect(settings.sqlite_path) as connection:  # docs/operations.md: Erasure
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            connection.execute("VACUUM")
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        files = [p for p in Path(settings.data_dir).rglob("*") if p.is_file()]
        assert settings.sqlite_path in files
        for path in files:
            assert marker.encode() not in path.read_bytes(), path
        return
    schema = settings.postgres.schema
    dump = subprocess.run(
        [postgres_program("pg_dump"), "--no-owner", "--schema", schema,
         "-d", settings.postgres.conninfo],
        capture_output=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert b"task_keys" in dump and b"feed_events" in dump
    assert marker.encode() not in dump
    for path in table_files(schema):
        assert marker.encode() not in path.read_bytes(), path


def table_files(schema):
    """Each table's (and TOAST table's) files in the schema after the
    documented VACUUM FULL, flushed to disk by a CHECKPOINT."""
    import psycopg

    with psycopg.connect(postgres_admin_url(), autocommit=True) as connection:
        tables = [
            row[0]
            for row in connection.execute(
                "SELECT format('%%I.%%I', schemaname, tablename) FROM pg_tables"
                " WHERE schemaname = %s",
                (schema,),
            )
        ]
        for table in tables:
            connection.execute(f"VACUUM FULL {table}")
        connection.execute("CHECKPOINT")
        found = relation_files(connection, schema)
    assert len(found) >= len(tables)
    return [
        p
        for base in found
        for p in [base, *base.parent.glob(base.name + ".*")]
        if p.is_file() and not p.name.endswith(("_fsm", "_vm"))
    ]


def relation_files(connection, schema):
    """The first file of each table (and TOAST table) of the schema, as the
    server ``connection`` reaches names them (each may have more segments)."""
    directory = Path(connection.execute("SHOW data_directory").fetchone()[0])
    paths = connection.execute(
        "SELECT pg_relation_filepath(c.oid) FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s"
        " AND c.relkind IN ('r', 't') UNION SELECT pg_relation_filepath(c.reltoastrelid)"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.reltoastrelid <> 0",
        (schema, schema),
    ).fetchall()
    return [directory / row[0] for row in paths if row[0]]


def test_the_auditors_page_shows_a_forgotten_task_as_forgotten(
    client, services, workspace, member, operator
):
    forgotten_task(client, services, member, operator)
    page = client.get(
        "/audit/identities",
        query_string={"workspace": str(workspace.id), "external_id": "ERASE-F"},
        headers=bearer(operator[1]),
    )
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert "(forgotten)" in html and MARKER not in html and "Forgotten" in html


def test_the_cli_forgets_a_task_as_the_route_does(client, services, member, cli):
    made = create(client, member[1], title=f"{MARKER} cli").json
    done = cli("task", "forget", made["id"], "--reason", "art. 17", "--json")
    assert done.exit_code == 0, done.output
    answer = json.loads(done.stdout)
    assert (answer["forgotten"], answer["actor"], answer["replayed"]) == (True, "cli", False)
    again = cli("task", "forget", made["id"], "--reason", "art. 17", "--json")
    assert json.loads(again.stdout)["replayed"] is True
    shown = cli("task", "get", made["id"], "--json")
    assert MARKER not in shown.stdout and json.loads(shown.stdout)["title"] is None
    refused = cli("task", "forget", str(uuid.uuid4()), "--reason", "art. 17")
    assert refused.exit_code != 0 and "task not found" in refused.output


def test_a_forget_while_the_feeds_are_rebuilt_leaves_no_free_text_in_them(
    client, services, workspace, member, operator
):
    """A rebuild replays into fresh tables and swaps them in: a forget after
    the replay decoded the task's events (with its key) but before the swap
    rewrote only the live feed rows. The rebuilt ones must not hold the text
    either: the feed projection's Forgotten rewrites the task's earlier rows."""
    made = create(client, member[1], external_id="ERASE-R", title=f"{MARKER} title")
    assert made.status_code == 200, made.json
    forgot = []

    def progress(position, head, applied):
        if position >= head and not forgot:  # replayed; the swap comes next
            forgot.append(forget(client, operator[1], made.json["id"]).status_code)

    rebuild(services.projections, "feeds", progress=progress)
    assert forgot == [200]
    feed, _, _ = read_side(services, workspace, client, member[1])
    assert len(feed) == 2 and MARKER not in repr(feed), feed
