"""Issue 47, points 5 and 6, on both backends. A store written before free
text was sealed (the upgrade fixtures: event format 0) is upgraded by
`db init`, still verifies, and its old tasks are forgotten by rewriting their
cleartext events under a redaction statement (docs/auditing.md: Erasure),
while a task created after the upgrade is forgotten by deleting its key; the
audit says which is which. And a lost data key reads as forgotten, never as
a 500."""

from __future__ import annotations

import time
import uuid

from kandev_es.bootstrap import bootstrap
from kandev_es.domain.principal import LOCAL_CLI
from tests.conftest import bearer
from tests.integration.helpers import create
from tests.integration.test_upgrade import old_store  # noqa: F401  (the fixture)
from tests.support.served import run_cli


def test_an_upgraded_store_forgets_old_tasks_by_statement_and_new_ones_by_key(
    old_store,  # noqa: F811
):
    old_store.db_init()
    old_task = uuid.UUID(old_store.manifest["tasks"]["JIRA-1"]["id"])
    title = old_store.manifest["tasks"]["JIRA-1"]["served"]["title"].encode()
    services = bootstrap(old_store.settings)
    try:
        assert any(title in row[-1] for rows in old_store.events().values() for row in rows)
        # An edit after the upgrade: sealed, under a key the old task gets with it.
        services.tasks.patch(LOCAL_CLI, old_task, {"description": "Jane Doe, after"})
        services.ledger.catch_up()
        forgot = services.forgetting().forget(LOCAL_CLI, old_task, "art. 17", "erase-old")
        assert forgot.body["forgotten"] is True
        with services.database.transaction() as tx:  # forgotten both ways at once
            key = old_task if old_store.backend == "postgres" else str(old_task)
            assert tx.execute("SELECT 1 FROM task_keys WHERE task_id = ?", (key,)) == []
        events = old_store.events()
        for marker in (title, b"Jane Doe, after"):
            assert not any(marker in row[-1] for rows in events.values() for row in rows)
        workspace = services.workspaces.get_by_name("acme")
        assert workspace is not None
        made = services.creation.create(
            LOCAL_CLI, {"workspace_id": str(workspace.id), "title": "Jane Doe's laptop"}
        )
        new_task = uuid.UUID(made.to_response()["id"])
        forgot = services.forgetting().forget(LOCAL_CLI, new_task, "art. 17", "erase-new")
        assert forgot.body["forgotten"] is True and forgot.body["actor"] == "cli"
        checkpoint_everything(services)  # the statements under a signed checkpoint
    finally:
        services.close()
    verified = run_cli(old_store.settings, "audit", "verify", "--ledger")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"task {new_task}: forgotten, consistent (2 sealed events;" in verified.stdout
    assert f"task {old_task}: forgotten, consistent (1 sealed events, " in verified.stdout
    assert f"stream {old_task} version 1: redacted by statement" in verified.stdout


def checkpoint_everything(services) -> None:
    """Sequence and sign until a checkpoint covers every stored event (on a
    shared PostgreSQL another database's open transaction can hold the
    settled prefix a moment behind a commit: test_ledger.logged)."""
    stored = len(
        list(services.app.recorder.select_notifications(start=0, limit=100_000))
    )  # ids may have gaps: count
    deadline = time.monotonic() + 20
    while True:
        note = services.ledger.catch_up()
        if note is not None and int(note.split("\n")[1]) >= stored:
            return
        assert time.monotonic() < deadline, "no checkpoint covers the events just stored"
        time.sleep(0.05)


def test_a_lost_key_reads_as_forgotten_over_http(settings, client, services, member):
    """The keys' table restored empty (lost keys): every read of the task
    answers 200 with its free text null; the read models keep what they held
    until a rebuild (docs/operations.md: Erasure)."""
    made = create(client, member[1], external_id="LOST-1", title="Jane Doe", description="x")
    task_id = made.json["id"]
    with services.database.transaction() as tx:
        tx.execute("DELETE FROM task_keys")
    services.close()
    fresh = bootstrap(settings)  # a process that never held the key
    try:
        from kandev_es.api import create_app

        http = create_app(services=fresh, run_projections=False).test_client()
        got = http.get(f"/api/v1/tasks/{task_id}", headers=bearer(member[1]))
        assert got.status_code == 200, got.json
        assert (got.json["title"], got.json["description"]) == (None, None)
        again = create(http, member[1], external_id="LOST-1", title="retry")
        assert again.status_code == 200 and again.json["id"] == task_id
    finally:
        fresh.close()
