"""Proof of ordering without a global write lock (docs/architecture.md:
Ordering without a global lock), on a real `kandev-es serve` over a real PostgreSQL, whose two
workers each run a projection runner:

- a creation held open on a second connection takes lower notification ids
  while later creations commit: nothing after it reaches the feed before it,
  and once it commits the SSE stream delivers every task.created exactly once,
  in id order; a rebuild of the feeds reproduces the same ids;
- a burst of 32 concurrent writers (distinct and shared external IDs) ends with
  `audit verify` clean and exactly one task.created per creation, in the feed
  and on an SSE stream that was open throughout."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from kandev_es.projections.inline import InlineViews

from kandev_es.bootstrap import Services, bootstrap
from kandev_es.config import Settings
from kandev_es.domain.creation import complete_without_effects
from kandev_es.domain.external_id import identity_id
from kandev_es.domain.identity import Identity
from kandev_es.domain.workspace import Workspace
from kandev_es.storage.view_writes import views_json
from tests.support.served import ServedProcess, http, run_cli
from tests.support.tasks import bare_task

WAIT_S = 60.0
INSERT = (
    "SELECT kandev_insert_events(%b::uuid[], %b::bigint[], %b::text[], %b::bytea[],"
    " %b::uuid[], %b::bigint[], %s::jsonb)"
)


def _wait_until(check: Any, what: str, seconds: float = WAIT_S) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class Stream(threading.Thread):
    """One SSE connection, collecting (id, type, subject, event id) as they arrive."""

    def __init__(self, server: ServedProcess, workspace: str, seconds: float = 120) -> None:
        super().__init__(daemon=True)
        self.url = (
            f"{server.base}/api/v1/workspaces/{workspace}/events/stream?max_seconds={seconds}"
        )
        self.token = server.token or ""
        self.events: list[tuple[int, str, str, str]] = []
        self.ended = threading.Event()

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        request = urllib.request.Request(self.url, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                fields: dict[str, str] = {}
                for raw in response:
                    line = raw.decode().rstrip("\n")
                    if line.startswith(":"):
                        continue
                    if line:
                        key, _, value = line.partition(": ")
                        fields[key] = value
                        continue
                    if "id" in fields:
                        data = json.loads(fields["data"])
                        self.events.append(
                            (int(fields["id"]), fields["event"], data["subject"], data["id"])
                        )
                    fields = {}
        finally:
            self.ended.set()


def _stream_once(server: ServedProcess, workspace: str) -> list[tuple[int, str, str, str]]:
    """Everything the feed holds, read through a fresh short SSE stream."""
    stream = Stream(server, workspace, seconds=1)
    stream.run()
    return stream.events


def _create(server: ServedProcess, workspace: str, external_id: str) -> Any:
    return http(
        "POST",
        f"{server.base}/api/v1/tasks",
        server.token,
        {"workspace_id": workspace, "external_id": external_id, "title": external_id},
        timeout=60,
    )


def _connect(settings: Settings, autocommit: bool = True) -> psycopg.Connection[Any]:
    assert settings.postgres is not None
    return psycopg.connect(settings.postgres.schema_conninfo, autocommit=autocommit)


def _activated(settings: Settings) -> list[tuple[int, str]]:
    """Ground truth: (notification id, task id) of every event a task.created
    comes from (Task.Activated, or Task.CreatedActive)."""
    with _connect(settings) as conn:
        rows = conn.execute(
            "SELECT notification_id, originator_id FROM kandev_events"
            " WHERE topic LIKE %s OR topic LIKE %s ORDER BY notification_id",
            ("%Task.Activated", "%Task.CreatedActive"),
        ).fetchall()
    return [(int(position), str(task_id)) for position, task_id in rows]


def _feed_rows(settings: Settings) -> int:
    with _connect(settings) as conn:
        row = conn.execute("SELECT count(*) FROM feed_events").fetchone()
    assert row is not None
    return int(row[0])


def _positions(settings: Settings) -> dict[str, int]:
    with _connect(settings) as conn:
        rows = conn.execute("SELECT name, position FROM projection_tracking").fetchall()
    return {str(name): int(position) for name, position in rows}


class HeldCreation:
    """A complete creation without effects (Claimed, Completed, the task's
    Created and Activated: the shape a creation claimed before it completed
    has, which projections still take) saved through the store's own insert function
    on a connection of its own, whose transaction stays open until ``commit``.
    ``take_transaction_id`` gives the transaction its id before anything else,
    as any transaction that did other work before its save has."""

    def __init__(
        self, helper: Services, settings: Settings, workspace_id: uuid.UUID, external_id: str
    ) -> None:
        app = helper.app
        workspace = app.load(workspace_id, Workspace)
        assert workspace is not None
        identity = Identity.register(
            identity_id(workspace_id, external_id), workspace_id, external_id
        )
        self.task_id = uuid.uuid4()
        tenure = identity.claim(
            task_id=self.task_id,
            owner_id="held-connection",
            actor="token:held",
            plan={"workspace_id": str(workspace_id), "external_id": external_id, "steps": []},
            plan_hash="0" * 64,
            lease_expires_at=datetime.now(UTC) + timedelta(minutes=5),
        )
        task = bare_task(
            self.task_id,
            workspace_id=workspace_id,
            identity_id=identity.id,
            identifier=f"{workspace.task_prefix}-{app.next_office_number(workspace_id)}",
            external_id=external_id,
            title=external_id,
            created_by="token:held",
        )
        complete_without_effects(identity, task, tenure.number)
        events = [*identity.collect_events(), *task.collect_events()]
        self._stored = [app.mapper.to_stored_event(event) for event in events]
        # Its read-model rows, written by the same insert (as the service's saves do).
        self._views = views_json(InlineViews()(events, [identity, task]))
        self._guard = (workspace_id, workspace.version)  # as a real create is guarded
        self.connection = _connect(settings, autocommit=False)
        self.ids: list[int] = []
        self.open = True

    def take_transaction_id(self) -> int:
        row = self.connection.execute("SELECT pg_current_xact_id()::text").fetchone()
        assert row is not None
        return int(row[0])

    def insert(self) -> None:
        stored = self._stored
        rows = self.connection.execute(
            INSERT,
            (
                [e.originator_id for e in stored],
                [e.originator_version for e in stored],
                [e.topic for e in stored],
                [e.state for e in stored],
                [self._guard[0]],
                [self._guard[1]],
                self._views,
            ),
        ).fetchall()
        self.ids = [int(row[0]) for row in rows]
        assert len(self.ids) == len(stored)

    def commit(self) -> None:
        self.connection.commit()
        self.close()

    def close(self) -> None:
        if self.open:
            self.open = False
            self.connection.close()  # rolls back what was not committed


@pytest.mark.postgres_only
def test_a_creation_held_open_below_later_ones_reaches_projection_and_sse_once(
    settings: Settings, tmp_path: Path
) -> None:
    server = ServedProcess(settings, tmp_path)
    helper = bootstrap(settings.with_overrides(create_tables=False))
    opened: list[HeldCreation] = []
    try:
        workspace = server.workspace_id
        stream = Stream(server, workspace)
        stream.start()
        before = [_create(server, workspace, f"B-{i}") for i in range(3)]
        assert [r.status for r in before] == [200] * 3
        _wait_until(lambda: len(stream.events) == 3, "the first three on the stream")

        # The order that defeats a reader filtering on transaction_id < xmin
        # alone: `early` has the lower transaction id but draws its ids after
        # `held`, and commits while `held` stays open below it.
        early = HeldCreation(helper, settings, uuid.UUID(workspace), "EARLY-1")
        held = HeldCreation(helper, settings, uuid.UUID(workspace), "HELD-1")
        opened.extend([early, held])
        early.take_transaction_id()
        held.insert()
        early.insert()
        early.commit()
        assert min(early.ids) > max(held.ids)
        later = [_create(server, workspace, f"L-{i}") for i in range(5)]
        assert [r.status for r in later] == [200] * 5
        # The later creations' feed rows are written (inline, with their
        # events) above the held ids, but no reader may pass the held ids: a
        # reader that did would never come back for them.
        _wait_until(lambda: _feed_rows(settings) == 9, "the feed rows of all but the held one")
        time.sleep(1.0)  # many SSE polls and runner passes
        assert [event[2] for event in stream.events] == [r.body["id"] for r in before]
        assert all(position < min(held.ids) for position in _positions(settings).values())
        found = _create(server, workspace, "L-0")  # the request path does not wait
        assert (found.status, found.body["outcome"]) == (200, "found_settled")

        held.commit()
        expected = _activated(settings)
        assert len(expected) == 10
        assert str(held.task_id) in {task_id for _, task_id in expected}
        _wait_until(lambda: len(stream.events) >= 10, "all ten on the stream")
        time.sleep(0.5)  # a duplicate would arrive right behind
        assert [(e[0], e[2]) for e in stream.events] == expected  # each once, in id order
        assert {e[1] for e in stream.events} == {"task.created"}
        tasks = http(
            "GET", f"{server.base}/api/v1/workspaces/{workspace}/tasks?limit=100", server.token
        ).body
        assert len(tasks["items"]) == 10

        feed = _stream_once(server, workspace)
        assert feed == stream.events
        rebuilt = run_cli(settings, "projections", "rebuild", "--name", "feeds")
        assert rebuilt.returncode == 0, rebuilt.stderr
        assert _stream_once(server, workspace) == feed  # same ids, same event ids
        audit = run_cli(settings, "audit", "verify", "--json")
        assert audit.returncode == 0, audit.stdout + audit.stderr
        assert json.loads(audit.stdout)["ok"] is True
    finally:
        for creation in opened:
            creation.close()
        helper.close()
        server.stop()


WRITERS = 32
PER_WRITER = 3


@pytest.mark.postgres_only
def test_a_32_writer_burst_ends_audit_clean_with_one_task_created_per_creation(
    settings: Settings, tmp_path: Path
) -> None:
    server = ServedProcess(settings, tmp_path)
    try:
        workspace = server.workspace_id
        stream = Stream(server, workspace, seconds=300)
        stream.start()
        start = threading.Barrier(WRITERS)
        answers: list[tuple[str, int, Any]] = []
        lock = threading.Lock()

        def writer(n: int) -> None:
            start.wait()
            # Own IDs, and IDs every writer races for (one task each).
            for external_id in [f"W{n}-{j}" for j in range(PER_WRITER)] + ["SHARED-1"]:
                reply = _create(server, workspace, external_id)
                with lock:
                    answers.append((external_id, reply.status, reply.body))

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(WRITERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        assert len(answers) == WRITERS * (PER_WRITER + 1)
        assert Counter(status for _, status, _ in answers) == {200: len(answers)}
        by_id: dict[str, set[str]] = {}
        for external_id, _, body in answers:
            by_id.setdefault(external_id, set()).add(body["id"])
        assert all(len(tasks) == 1 for tasks in by_id.values())  # one task per ID
        created = {task for tasks in by_id.values() for task in tasks}
        assert len(created) == WRITERS * PER_WRITER + 1

        _wait_until(lambda: len(stream.events) >= len(created), "every creation on the stream")
        time.sleep(0.5)  # a duplicate would arrive right behind
        expected = _activated(settings)
        assert [(e[0], e[2]) for e in stream.events] == expected
        assert Counter(e[2] for e in stream.events) == dict.fromkeys(created, 1)
        assert _stream_once(server, workspace) == stream.events  # the feed holds the same
        audit = run_cli(settings, "audit", "verify", "--json")
        assert audit.returncode == 0, audit.stdout + audit.stderr
        report = json.loads(audit.stdout)
        assert report["ok"] is True and report["task_streams"] == len(created)
    finally:
        server.stop()
