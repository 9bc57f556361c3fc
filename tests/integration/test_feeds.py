"""Feeds: exactly one task.created per completed creation (on
Task.Activated), none for a Found, none before Completed; task.updated for
edits, archive and release; deterministic ids; paging; SSE resumption."""

from __future__ import annotations

import json
import uuid

from kandev_es.projections.feeds import FEED_NAMESPACE

from kandev_es.domain.identity import Identity
from kandev_es.domain.task import Task
from kandev_es.views import task_dto
from tests.conftest import bearer
from tests.integration.helpers import create, start_unsettled_creation
from tests.support.errors import without_request_id


def feed(client, services, workspace, secret, **query):
    services.projections.catch_up()
    answer = client.get(
        f"/api/v1/workspaces/{workspace.id}/events", query_string=query, headers=bearer(secret)
    )
    assert answer.status_code == 200, answer.json
    return answer.json


def release(services, task_id, operation_id="op-1"):
    """The release path at the domain level: identity released, task cleared, one save."""
    task = services.app.load(uuid.UUID(str(task_id)), Task)
    identity = services.app.load(task.identity_id, Identity)
    identity.release(identity.holder.number, operation_id, "operator", actor="token:test")
    task.clear_external_id(operation_id, "operator")
    services.app.save_atomically(identity, task)


def complete_in_flight(services, task):
    """Finish the preparing tenure the helper started, as its owner would."""
    identity = services.app.load(task.identity_id, Identity)
    tenure = max(identity.tenures)
    identity.begin_completing(tenure)
    outcome = identity.complete(tenure)
    current = services.app.load(task.id, Task)
    current.activate(drop_external_id=outcome == "created_identity_lost")
    services.app.save_atomically(identity, current)


def test_each_completed_creation_emits_exactly_one_task_created(
    client, services, workspace, member
):
    _, secret = member
    made = [
        create(client, secret, external_id="F-1", title="one").json,
        create(client, secret, external_id="F-2", title="two").json,
        create(client, secret, title="anonymous").json,
    ]
    items = feed(client, services, workspace, secret)["items"]
    assert [e["type"] for e in items] == ["task.created"] * 3
    assert [e["subject"] for e in items] == [t["id"] for t in made]
    first = items[0]
    assert set(first) == {"id", "type", "subject", "source", "timestamp", "data"}
    assert first["source"] == f"kandev-es/workspaces/{workspace.id}"
    assert first["data"]["external_id"] == "F-1" and first["data"]["state"] == "active"
    assert "external_id" not in items[2]["data"]


def test_found_retries_emit_no_task_created(client, services, workspace, member):
    _, secret = member
    create(client, secret, external_id="R-1", title="once")
    for _ in range(3):
        assert create(client, secret, external_id="R-1", title="x").json["outcome"] == (
            "found_settled"
        )
    items = feed(client, services, workspace, secret)["items"]
    assert [e["type"] for e in items] == ["task.created"]


def test_no_task_created_before_the_creation_completes(client, services, workspace, member):
    _, secret = member
    in_flight = start_unsettled_creation(services, workspace, "U-1")
    assert create(client, secret, external_id="U-1", title="retry").json["outcome"] == (
        "found_unsettled"
    )
    assert feed(client, services, workspace, secret)["items"] == []
    complete_in_flight(services, in_flight)
    items = feed(client, services, workspace, secret)["items"]
    assert [(e["type"], e["subject"]) for e in items] == [("task.created", str(in_flight.id))]
    assert items[0]["data"]["external_id"] == "U-1"


def test_release_while_preparing_publishes_one_created_without_the_id(
    client, services, workspace, member
):
    """AC-TASKS-EXTERNAL-ID-001.7: nothing published before task.created."""
    _, secret = member
    in_flight = start_unsettled_creation(services, workspace, "U-2")
    release(services, in_flight.id, "op-early")
    assert feed(client, services, workspace, secret)["items"] == []
    complete_in_flight(services, in_flight)
    items = feed(client, services, workspace, secret)["items"]
    assert [e["type"] for e in items] == ["task.created"]
    assert "external_id" not in items[0]["data"]


def test_patch_archive_and_release_emit_task_updated(client, services, workspace, member):
    _, secret = member
    task = create(client, secret, external_id="W-1", title="old").json
    url = f"/api/v1/tasks/{task['id']}"
    client.patch(url, json={"title": "new"}, headers=bearer(secret))
    client.patch(url, json={"title": "new"}, headers=bearer(secret))  # no change, no event
    client.post(url + "/archive", headers=bearer(secret))
    release(services, task["id"])
    items = feed(client, services, workspace, secret)["items"]
    assert [e["type"] for e in items] == ["task.created"] + ["task.updated"] * 3
    assert [e["data"]["revision"] for e in items] == [1, 2, 3, 4]
    assert items[1]["data"]["title"] == "new"
    assert items[2]["data"]["archived"] is True and items[2]["data"]["external_id"] == "W-1"
    assert "external_id" not in items[3]["data"]


def test_feed_ids_derive_from_the_originating_event_and_data_matches_that_version(
    client, services, workspace, member
):
    _, secret = member
    task = create(client, secret, external_id="D-1", title="t").json
    client.patch(f"/api/v1/tasks/{task['id']}", json={"title": "u"}, headers=bearer(secret))
    items = feed(client, services, workspace, secret)["items"]
    events = list(services.app.events.get(uuid.UUID(task["id"])))
    sources = [
        e for e in events if isinstance(e, Task.Activated | Task.CreatedActive | Task.Updated)
    ]
    assert [e["id"] for e in items] == [
        str(uuid.uuid5(FEED_NAMESPACE, f"{e.originator_id}:{e.originator_version}"))
        for e in sources
    ]
    for item, event in zip(items, sources, strict=True):
        at_version = services.app.repository.get(
            event.originator_id, version=event.originator_version
        )
        assert item["data"] == task_dto(at_version)
        assert item["timestamp"] == event.timestamp.isoformat()


def test_feed_pages_by_cursor(client, services, workspace, member):
    _, secret = member
    for i in range(5):
        create(client, secret, external_id=f"P-{i}", title=f"t{i}")
    first = feed(client, services, workspace, secret, limit=2)
    assert len(first["items"]) == 2 and first["has_more"] is True
    second = feed(client, services, workspace, secret, limit=2, after=first["next_cursor"])
    third = feed(client, services, workspace, secret, limit=2, after=second["next_cursor"])
    assert len(third["items"]) == 1 and third["has_more"] is False
    titles = [e["data"]["title"] for e in first["items"] + second["items"] + third["items"]]
    assert titles == [f"t{i}" for i in range(5)]
    tail = feed(client, services, workspace, secret, after=third["next_cursor"])
    assert tail == {"items": [], "next_cursor": third["next_cursor"], "has_more": False}


def test_bad_cursor_or_limit_is_a_typed_400(client, services, workspace, member):
    _, secret = member
    url = f"/api/v1/workspaces/{workspace.id}/events"
    for query in ({"after": "x"}, {"after": "-1"}, {"limit": "0"}, {"limit": "5000"}):
        answer = client.get(url, query_string=query, headers=bearer(secret))
        assert answer.status_code == 400
        assert answer.json["error"] == "invalid_cursor"
    stream = client.get(url + "/stream", headers={**bearer(secret), "Last-Event-ID": "nope"})
    assert stream.status_code == 400 and stream.json["error"] == "invalid_cursor"


def test_other_workspace_feed_is_not_found(client, services, workspace, member, admin):
    _, secret = member
    create(client, secret, external_id="O-1", title="mine")
    other = services.workspaces.open("other")
    other_secret, _ = services.tokens.issue(workspace_id=other.id, admin=False)
    services.projections.catch_up()
    for path in ("events", "events/stream"):
        url = f"/api/v1/workspaces/{workspace.id}/{path}"
        denied = client.get(url, headers=bearer(other_secret))
        assert denied.status_code == 404, denied
        assert without_request_id(denied.json) == {"error": "workspace not found"}
        assert client.get(url).status_code == 404
    unknown = client.get(f"/api/v1/workspaces/{uuid.uuid4()}/events", headers=bearer(admin[1]))
    assert unknown.status_code == 404
    as_admin = client.get(f"/api/v1/workspaces/{workspace.id}/events", headers=bearer(admin[1]))
    assert [e["data"]["title"] for e in as_admin.json["items"]] == ["mine"]


def _sse(body: str) -> list[dict]:
    events = []
    for block in body.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if line and ":" in line[1:]
        )
        if "data" in fields:
            events.append(
                {
                    "id": int(fields["id"]),
                    "event": fields["event"],
                    "data": json.loads(fields["data"]),
                }
            )
    return events


def test_sse_stream_resumes_after_last_event_id(client, services, workspace, member):
    _, secret = member
    for i in range(3):
        create(client, secret, external_id=f"S-{i}", title=f"s{i}")
    services.projections.catch_up()
    url = f"/api/v1/workspaces/{workspace.id}/events/stream"
    answer = client.get(url, query_string={"max_seconds": 0}, headers=bearer(secret))
    assert answer.status_code == 200
    assert answer.mimetype == "text/event-stream"
    seen = _sse(answer.get_data(as_text=True))
    assert [e["data"]["data"]["title"] for e in seen] == ["s0", "s1", "s2"]
    assert all(e["event"] == "task.created" for e in seen)

    create(client, secret, external_id="S-3", title="s3")
    services.projections.catch_up()
    resumed = client.get(
        url,
        query_string={"max_seconds": 0},
        headers={**bearer(secret), "Last-Event-ID": str(seen[1]["id"])},
    )
    titles = [e["data"]["data"]["title"] for e in _sse(resumed.get_data(as_text=True))]
    assert titles == ["s2", "s3"]


def test_sse_stream_delivers_events_that_arrive_while_open(client, services, workspace, member):
    import threading
    import time

    _, secret = member
    url = f"/api/v1/workspaces/{workspace.id}/events/stream"

    def later():
        time.sleep(0.3)
        create(client, secret, external_id="L-1", title="late")
        services.projections.catch_up()

    worker = threading.Thread(target=later)
    worker.start()
    answer = client.get(url, query_string={"max_seconds": 2}, headers=bearer(secret))
    worker.join()
    assert [e["data"]["data"]["title"] for e in _sse(answer.get_data(as_text=True))] == ["late"]


def test_release_route_and_its_replay_emit_exactly_one_task_updated(
    client, services, workspace, operator
):
    """AC-TASKS-EXTERNAL-ID-001.6: one immutable task.updated per release operation."""
    _, secret = operator
    task = create(client, secret, external_id="REL-1", title="t").json
    url = f"/api/v1/workspaces/{workspace.id}/tasks/by-external-id"
    headers = {**bearer(secret), "Idempotency-Key": "op-rel-1"}
    for _ in range(2):  # the second is a replay of the same operation
        answer = client.delete(url, query_string={"external_id": "REL-1"}, headers=headers)
        assert answer.status_code == 200, answer.json
    items = feed(client, services, workspace, secret)["items"]
    assert [e["type"] for e in items] == ["task.created", "task.updated"]
    assert items[1]["subject"] == task["id"] and "external_id" not in items[1]["data"]
    assert items[1]["data"]["revision"] == 2
