"""A store written by an earlier version upgrades with this version's
``kandev-es db init`` (docs/operations.md: Upgrading), on SQLite and PostgreSQL.

The earlier stores are tests/fixtures/upgrade/<version>/: what that version's
own CLI and served process wrote (scripts/make-upgrade-fixture: creates, a
found retry, a repository effect, an edit, an archive, a release, a deletion, a
subtask, two workspaces; projections caught up), dumped as text, with a
manifest of what it holds. Each test loads a dump into a fresh store (SQLite:
``executescript``; PostgreSQL: ``psql -f`` into a fresh database) and runs the
current ``kandev-es`` as real processes against it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kandev_es.config import Settings
from tests.conftest import postgres_admin_url
from tests.support.postgres import create_database, drop_database, postgres_program
from tests.support.served import ServedProcess, http, run_cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "upgrade"
VERSIONS = sorted(path.name for path in FIXTURES.iterdir() if path.is_dir())
WAIT_S = 30.0


@dataclass
class OldStore:
    """An earlier version's store, loaded and not yet upgraded."""

    backend: str
    settings: Settings
    manifest: dict[str, Any]

    @property
    def notification_id(self) -> str:
        return "rowid" if self.backend == "sqlite" else "notification_id"

    @contextlib.contextmanager
    def connect(self) -> Iterator[Any]:
        if self.backend == "sqlite":
            with contextlib.closing(sqlite3.connect(self.settings.sqlite_path)) as conn:
                yield conn
            return
        import psycopg

        assert self.settings.database_url
        with psycopg.connect(self.settings.database_url, autocommit=True) as conn:
            yield conn

    def events(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every stored event of every events table: notification id,
        originator id and version, topic, state."""
        nid = self.notification_id
        with self.connect() as conn:
            return {
                table: [
                    (row[0], str(row[1]), row[2], row[3], bytes(row[4]))
                    for row in conn.execute(
                        f"SELECT {nid}, originator_id, originator_version, topic, state"
                        f" FROM {table} ORDER BY {nid}"
                    ).fetchall()
                ]
                for table in self.manifest["events"]
            }

    def tracking(self) -> dict[str, int]:
        with self.connect() as conn:
            return dict(conn.execute("SELECT name, position FROM projection_tracking").fetchall())

    def newest(self) -> int:
        nid = self.notification_id
        with self.connect() as conn:
            return max(
                int(conn.execute(f"SELECT coalesce(max({nid}), 0) FROM {table}").fetchone()[0])
                for table in self.manifest["events"]
            )

    def feed(self) -> list[tuple[Any, ...]]:
        with self.connect() as conn:
            return [
                tuple(map(str, row))
                for row in conn.execute(
                    "SELECT position, workspace_id, event_id, type, subject, timestamp, data"
                    " FROM feed_events ORDER BY position"
                ).fetchall()
            ]

    def dump(self) -> str:
        """The whole store as SQL text: schema, functions, sequences, every row."""
        if self.backend == "sqlite":
            with self.connect() as conn:
                return "\n".join(conn.iterdump())
        assert self.settings.database_url
        done = subprocess.run(
            [postgres_program("pg_dump"), "--no-owner", "--no-privileges",
             "-d", self.settings.database_url],
            capture_output=True, text=True, timeout=60, check=True,
        )
        # pg_dump 15.14+ brackets the dump with \restrict KEY, a random key.
        return "\n".join(line for line in done.stdout.splitlines()
                         if not line.startswith(("\\restrict", "\\unrestrict")))

    def db_init(self) -> None:
        done = run_cli(self.settings, "db", "init")
        assert done.returncode == 0, done.stderr

    def wait_caught_up(self) -> int:
        """Until every projection's position is the newest notification id."""
        deadline = time.monotonic() + WAIT_S
        while True:
            newest, tracking = self.newest(), self.tracking()
            if set(tracking.values()) == {newest}:
                return newest
            assert time.monotonic() < deadline, f"projections at {tracking}, events at {newest}"
            time.sleep(0.1)


def digest(rows: list[tuple[Any, ...]]) -> str:
    """As scripts/make-upgrade-fixture computed it over the store it wrote."""
    text = "".join(
        f"{nid}\t{originator}\t{version}\t{topic}\t{state.hex()}\n"
        for nid, originator, version, topic, state in rows
    )
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(params=VERSIONS)
def old_store(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> Iterator[OldStore]:
    fixture = FIXTURES / request.param
    manifest = json.loads((fixture / "manifest.json").read_text())["backends"][backend]
    dump = fixture / f"{backend}.sql"
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    if backend == "sqlite":
        settings = Settings(data_dir=data_dir, repository_roots=(tmp_path,))
        with contextlib.closing(sqlite3.connect(settings.sqlite_path)) as conn:
            conn.executescript(dump.read_text())
        yield OldStore(backend, settings, manifest)
        return
    name = f"upgrade_{uuid.uuid4().hex[:16]}"
    url = create_database(postgres_admin_url(), name)
    try:
        subprocess.run(
            [postgres_program("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
             "-d", url, "-f", str(dump)],
            capture_output=True, text=True, timeout=60, check=True,
        )
        settings = Settings(data_dir=data_dir, database_url=url, repository_roots=(tmp_path,))
        yield OldStore(backend, settings, manifest)
    finally:
        drop_database(postgres_admin_url(), name)


def test_the_loaded_fixture_is_the_store_the_previous_version_wrote(old_store):
    events = old_store.events()
    assert {table: len(rows) for table, rows in events.items()} == old_store.manifest["events"]
    assert {table: digest(rows) for table, rows in events.items()} == (
        old_store.manifest["event_digests"]
    )
    assert old_store.tracking() == old_store.manifest["projection_tracking"]
    assert old_store.newest() == old_store.manifest["max_notification_id"]


def test_db_init_keeps_every_event_and_projection_position(old_store):
    events, tracking, feed = old_store.events(), old_store.tracking(), old_store.feed()

    old_store.db_init()

    assert old_store.events() == events  # ids, versions, topics, state bytes, notification ids
    assert old_store.tracking() == tracking == old_store.manifest["projection_tracking"]
    assert old_store.feed() == feed
    # The old events were logged by db init (chains and the Merkle log) and verify clean.
    verified = run_cli(old_store.settings, "audit", "verify", "--ledger")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"ledger: {sum(len(rows) for rows in events.values())} events" in verified.stdout


def test_a_second_db_init_changes_nothing(old_store):
    old_store.db_init()
    upgraded = old_store.dump()

    old_store.db_init()

    assert old_store.dump() == upgraded


def test_the_upgraded_store_serves_the_old_tasks_and_goes_on_after_them(old_store, tmp_path):
    manifest = old_store.manifest
    old_newest = manifest["max_notification_id"]
    old_feed = old_store.feed()
    tasks = manifest["tasks"]
    admin, operator = manifest["tokens"]["admin"], manifest["tokens"]["acme_operator"]
    default = manifest["workspaces"]["default"]["id"]
    old_store.db_init()

    server = ServedProcess(old_store.settings, tmp_path / "logs")
    try:
        assert server.workspace_id == default and not server.first_start
        api = server.base + "/api/v1"

        for key, task in tasks.items():  # each, as the previous version served it
            got = http("GET", f"{api}/tasks/{task['id']}", admin)
            if task["deleted"]:
                assert got.status == 404, key
                continue
            assert got.status == 200, (key, got.body)
            assert {field: got.body.get(field) for field in task["served"]} == task["served"]
        for name, workspace in manifest["workspaces"].items():
            listed = http("GET", f"{api}/workspaces/{workspace['id']}/tasks"
                          "?include_archived=true&limit=100", admin)
            assert listed.status == 200, listed.body
            assert {item["id"] for item in listed.body["items"]} == {
                task["id"] for task in tasks.values()
                if task["workspace_id"] == workspace["id"] and not task["deleted"]
            }, name

        # Retries of old external IDs are Found, with the old tasks; old tokens still act.
        again = http("POST", f"{api}/tasks", admin,
                     {"workspace_id": default, "external_id": "JIRA-1", "title": "again"})
        assert again.status == 200, again.body
        assert (again.body["outcome"], again.body["id"], again.body["identifier"]) == (
            "found_settled", tasks["JIRA-1"]["id"], tasks["JIRA-1"]["identifier"])
        again = http("POST", f"{api}/tasks", operator, {"external_id": "JIRA-1", "title": "x"})
        assert (again.body["outcome"], again.body["id"]) == (
            "found_settled", tasks["acme/JIRA-1"]["id"])
        again = http("POST", f"{api}/tasks", admin,
                     {"workspace_id": default, "external_id": "JIRA-2", "title": "again"})
        assert (again.body["outcome"], again.body["id"]) == ("found_settled", tasks["JIRA-2"]["id"])

        # A new create takes the next office number, above every old one.
        numbers = [int(task["identifier"].split("-")[1]) for task in tasks.values()
                   if task["workspace_id"] == default]
        new = http("POST", f"{api}/tasks", admin,
                   {"workspace_id": default, "external_id": "NEW-1", "title": "after the upgrade"})
        assert new.status == 200 and new.body["outcome"] == "created", new.body
        assert new.body["identifier"] == f"KAN-{max(numbers) + 1}"
        # The identities the old version released or deleted are free.
        reused = {}
        for external_id in ("JIRA-3", "JIRA-4"):
            made = http("POST", f"{api}/tasks", admin,
                        {"workspace_id": default, "external_id": external_id, "title": "again"})
            assert made.status == 200 and made.body["outcome"] == "created", made.body
            assert made.body["id"] != tasks[external_id]["id"]
            reused[external_id] = made.body
        assert [reused[e]["identifier"] for e in ("JIRA-3", "JIRA-4")] == [
            f"KAN-{max(numbers) + 2}", f"KAN-{max(numbers) + 3}"]

        # The projections go on from their old positions: the new tasks are
        # listed and in the feed, after every old feed row, none replayed.
        newest = old_store.wait_caught_up()
        assert newest > old_newest
        listed = http("GET", f"{api}/workspaces/{default}/tasks?external_id=NEW-1", admin)
        assert [item["id"] for item in listed.body["items"]] == [new.body["id"]]
        feed = http("GET", f"{api}/workspaces/{default}/events?after={old_newest}", admin)
        assert feed.status == 200, feed.body
        created = [e["subject"] for e in feed.body["items"] if e["type"] == "task.created"]
        assert created == [new.body["id"], reused["JIRA-3"]["id"], reused["JIRA-4"]["id"]]
        assert old_store.feed()[: len(old_feed)] == old_feed
    finally:
        server.stop()
    verified = run_cli(old_store.settings, "audit", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
