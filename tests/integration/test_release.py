"""AC-TASKS-EXTERNAL-ID-001.6 / .7: operator release by a stable operation id.

A completed identity is cleared atomically with a revision bump and exactly
one immutable task.updated; a replay returns the stored result without
reading the identity, so it never touches a later holder; completing is a
typed conflict; a preparing creation's release publishes nothing and its
later Complete emits one task.created without the ID and answers
created_identity_lost."""

from __future__ import annotations

import json
import threading

from tests.conftest import bearer
from tests.integration.helpers import PausedCreation, create
from tests.support.errors import without_request_id


def release(client, workspace, secret, external_id, operation_id=None):
    headers = bearer(secret)
    if operation_id is not None:
        headers["Idempotency-Key"] = operation_id
    return client.delete(
        f"/api/v1/workspaces/{workspace.id}/tasks/by-external-id",
        query_string={"external_id": external_id},
        headers=headers,
    )


def lookup(client, workspace, secret, external_id):
    return client.get(
        f"/api/v1/workspaces/{workspace.id}/tasks/by-external-id",
        query_string={"external_id": external_id},
        headers=bearer(secret),
    )


def feed(services, task_id: str) -> list[tuple[str, dict]]:
    services.projections.catch_up()
    with services.database.transaction() as tx:
        rows = tx.execute("SELECT type, subject, data FROM feed_events ORDER BY position")
    return [(kind, json.loads(data)) for kind, subject, data in rows if str(subject) == task_id]


def count_topic(services, suffix: str) -> int:
    notifications = services.app.recorder.select_notifications(start=1, limit=1_000_000)
    return sum(1 for n in notifications if n.topic.endswith(suffix))


def test_release_requires_a_stable_operation_id(client, services, workspace, operator):
    _, secret = operator
    create(client, secret, external_id="REL-0", title="t")
    before = services.app.max_notification_id()
    for bad in [None, "", "has space", "tab\tkey", "x" * 201]:
        answer = release(client, workspace, secret, "REL-0", bad)
        assert answer.status_code == 400, bad
        assert answer.json["error"] == "idempotency_key_required"
    assert services.app.max_notification_id() == before
    assert lookup(client, workspace, secret, "REL-0").status_code == 200


def test_release_of_a_completed_identity_keeps_the_task_and_emits_one_update(
    client, services, workspace, operator
):
    _, secret = operator
    task = create(client, secret, external_id="REL-1", title="t").json
    answer = release(client, workspace, secret, "REL-1", "op-1")
    assert answer.status_code == 200
    assert answer.headers["Idempotent-Replayed"] == "false"
    assert answer.json["released"] is True and answer.json["id"] == task["id"]
    assert "external_id" not in answer.json
    assert answer.json["revision"] == task["revision"] + 1

    survivor = client.get(f"/api/v1/tasks/{task['id']}", headers=bearer(secret)).json
    assert "external_id" not in survivor and survivor["revision"] == 2
    assert lookup(client, workspace, secret, "REL-1").status_code == 404
    kinds = [kind for kind, _ in feed(services, task["id"])]
    assert kinds == ["task.created", "task.updated"]
    assert "external_id" not in feed(services, task["id"])[1][1]
    # The identity is free: the next create makes a new task.
    again = create(client, secret, external_id="REL-1", title="second")
    assert again.json["outcome"] == "created" and again.json["id"] != task["id"]


def test_replay_returns_the_stored_result_and_never_touches_a_later_holder(
    client, services, workspace, operator
):
    _, secret = operator
    create(client, secret, external_id="REL-2", title="first")
    first = release(client, workspace, secret, "REL-2", "op-2")
    later = create(client, secret, external_id="REL-2", title="later holder").json
    before = services.app.max_notification_id()

    replay = release(client, workspace, secret, "REL-2", "op-2")
    assert replay.status_code == 200
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json == first.json
    assert services.app.max_notification_id() == before
    holder = lookup(client, workspace, secret, "REL-2").json
    assert holder["id"] == later["id"] and holder["external_id"] == "REL-2"


def test_release_of_a_free_identity_is_404_and_stays_404_on_replay(
    client, services, workspace, operator
):
    _, secret = operator
    assert release(client, workspace, secret, "REL-3", "op-3").status_code == 404
    create(client, secret, external_id="REL-3", title="arrives later")
    replay = release(client, workspace, secret, "REL-3", "op-3")
    assert replay.status_code == 404 and replay.headers["Idempotent-Replayed"] == "true"
    assert lookup(client, workspace, secret, "REL-3").status_code == 200


def test_same_operation_id_for_another_identity_is_422(client, services, workspace, operator):
    _, secret = operator
    create(client, secret, external_id="REL-4", title="t")
    create(client, secret, external_id="REL-5", title="t")
    assert release(client, workspace, secret, "REL-4", "op-45").status_code == 200
    before = services.app.max_notification_id()
    reused = release(client, workspace, secret, "REL-5", "op-45")
    assert reused.status_code == 422 and reused.json["error"] == "operation_id_reused"
    assert services.app.max_notification_id() == before
    assert lookup(client, workspace, secret, "REL-5").status_code == 200


def test_16_concurrent_replays_release_once(client, services, workspace, member):
    _, secret = member
    task = create(client, secret, external_id="REL-6", title="t").json
    barrier = threading.Barrier(16)
    answers: list = []

    def replay() -> None:
        barrier.wait(timeout=30)
        answers.append(services.release.release(workspace.id, "REL-6", "op-6", actor="cli"))

    threads = [threading.Thread(target=replay) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(answers) == 16
    assert {a.released for a in answers} == {True}
    assert sum(1 for a in answers if not a.replayed) == 1
    assert len({json.dumps(a.body, sort_keys=True) for a in answers}) == 1
    assert count_topic(services, "Task.ExternalIdCleared") == 1
    assert [k for k, _ in feed(services, task["id"])].count("task.updated") == 1


def test_release_from_another_workspace_is_404(client, services, workspace, member):
    _, secret = member
    create(client, secret, external_id="REL-7", title="t")
    other = services.workspaces.open("other", "OTH")
    other_secret, _ = services.tokens.issue(workspace_id=other.id, admin=False)
    answer = release(client, workspace, other_secret, "REL-7", "op-7")
    assert answer.status_code == 404
    assert lookup(client, workspace, secret, "REL-7").status_code == 200


def test_release_while_preparing_publishes_nothing_then_complete_is_identity_lost(
    client, services, workspace, operator, admin, paused_owner
):
    _, secret = operator
    _, admin_secret = admin
    paused = PausedCreation(
        client, workspace, admin_secret, paused_owner, secret,
        {"external_id": "PREP-1", "title": "slow"},
    )
    in_flight = create(client, secret, external_id="PREP-1", title="t").json
    assert in_flight["outcome"] == "found_unsettled"

    released = release(client, workspace, secret, "PREP-1", "op-prep")
    assert released.status_code == 200 and released.json["creation_complete"] is False
    assert feed(services, in_flight["id"]) == [], "nothing is published before task.created"
    # Meanwhile a new create may claim the identity as a new tenure.
    newcomer = create(client, secret, external_id="PREP-1", title="newcomer").json
    assert newcomer["outcome"] == "created" and newcomer["id"] != in_flight["id"]

    outcome, error = paused.finish()
    assert error is None and outcome is not None
    assert outcome["outcome"] == "created_identity_lost"
    assert outcome["deduplicated"] is False and outcome["creation_complete"] is True
    assert "external_id" not in outcome and outcome["id"] == in_flight["id"]
    events = feed(services, in_flight["id"])
    assert [kind for kind, _ in events] == ["task.created"]
    assert "external_id" not in events[0][1]
    assert lookup(client, workspace, secret, "PREP-1").json["id"] == newcomer["id"]


def test_release_while_completing_is_a_typed_conflict(
    settings, client, services, workspace, operator
):
    from tests.integration.test_runtime_recovery import crash_create

    _, secret = operator
    # A plan with an effect step, so Completing is a commit of its own.
    services.workspaces.set_wip_limit(workspace.id, 5)
    crash_create(
        settings, secret, {"external_id": "COMP-1", "title": "t"}, "completing:after", lease=120
    )
    before = services.app.max_notification_id()
    answer = release(client, workspace, secret, "COMP-1", "op-comp")
    assert answer.status_code == 409 and answer.json["error"] == "release_conflict"
    assert services.app.max_notification_id() == before
    # Nothing was stored: once settled, the same operation id releases it.
    assert create(client, secret, external_id="COMP-1", title="t").json["outcome"] == (
        "found_unsettled"
    )


def _stored_as_version_1(services, workspace, operation_id: str, new_operation_id: str):
    """The release recorded for ``operation_id``, written again under
    ``new_operation_id`` as the version-1 event stored it: the HTTP status it was
    answered with instead of ``released``, and no class_version."""
    from eventsourcing.persistence import StoredEvent

    from kandev_es.domain.release import release_operation_id

    app = services.app
    [stored] = app.recorder.select_events(release_operation_id(workspace.id, operation_id))
    state = app.mapper.transcoder.decode(stored.state)
    assert state.pop("class_version") == 2
    state["status"] = 200 if state.pop("released") else 404
    state["operation_id"] = new_operation_id
    new_id = release_operation_id(workspace.id, new_operation_id)
    state["originator_id"] = new_id
    app.recorder.insert_events([StoredEvent(
        originator_id=new_id,
        originator_version=stored.originator_version,
        topic=stored.topic,
        state=app.mapper.transcoder.encode(state),
    )])


def test_a_release_stored_with_its_http_status_replays_the_same(
    client, services, workspace, operator
):
    """Releases recorded before ``released`` replaced the stored HTTP status
    (version 1 of ReleaseOperation.Recorded) still replay: same status, same
    body, marked replayed."""
    _, secret = operator
    create(client, secret, external_id="REL-V1", title="t")
    first = {
        "op-v1-released": release(client, workspace, secret, "REL-V1", "op-v1-released"),
        "op-v1-free": release(client, workspace, secret, "REL-V1-FREE", "op-v1-free"),
    }
    assert [a.status_code for a in first.values()] == [200, 404]
    for operation_id, answer in first.items():
        _stored_as_version_1(services, workspace, operation_id, operation_id + "-old")
        external_id = "REL-V1" if operation_id == "op-v1-released" else "REL-V1-FREE"
        replay = release(client, workspace, secret, external_id, operation_id + "-old")
        # The same answer; an error's request_id is each answer's own.
        assert replay.status_code == answer.status_code
        if answer.status_code == 200:
            assert replay.json == answer.json
        else:
            assert without_request_id(replay.json) == without_request_id(answer.json)
        assert replay.headers["Idempotent-Replayed"] == "true"
