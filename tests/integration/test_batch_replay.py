"""A batch sent with an Idempotency-Key replays its first answer (issue 44
point 4): the same key and body answer the first results (Idempotent-Replayed:
true) and write nothing; another body is 422; a batch still in flight is 409;
a key whose batch answered an error, or whose lease ran out, runs again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kandev_es.bulk.replay import body_hash
from kandev_es.domain.batch import BatchOperation, batch_operation_id
from tests.conftest import bearer
from tests.integration.helpers import task_created_count

BATCH = "/api/v1/tasks/batch"


def send(client, secret, body, key):
    return client.post(BATCH, json=body, headers={**bearer(secret), "Idempotency-Key": key})


def test_the_same_key_and_body_replay_the_first_answer_and_write_nothing(
    client, services, workspace, member
):
    _, secret = member
    body = {
        "tasks": [
            {"external_id": "R-1", "title": "one"},
            {"title": "anonymous"},
            {"external_id": "R-2", "title": ""},
        ]
    }
    first = send(client, secret, body, "sync-2026-01")
    assert first.status_code == 200, first.json
    assert first.headers["Idempotent-Replayed"] == "false"
    mark = services.app.max_notification_id()
    again = send(client, secret, body, "sync-2026-01")
    assert again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert services.app.max_notification_id() == mark
    assert task_created_count(services) == 2  # the anonymous item was not made twice
    assert again.json["summary"] == first.json["summary"]
    for one, two in zip(first.json["results"], again.json["results"], strict=True):
        assert (one["index"], one["status"], one["outcome"]) == (
            two["index"],
            two["status"],
            two["outcome"],
        )
        if "result" in one:
            assert one["result"]["id"] == two["result"]["id"]
            assert "creation_handle" in one["result"]
            assert "creation_handle" not in two["result"]  # only its hash is stored
        else:
            assert one["error"] == two["error"]
    # Without the key, a retry is still safe by external ID (the anonymous item
    # is a new task: it has no identity).
    plain = client.post(BATCH, json=body, headers=bearer(secret))
    assert [r["outcome"] for r in plain.json["results"]] == ["found_settled", "created", "failed"]


def test_the_same_key_with_another_body_is_422(client, services, member):
    _, secret = member
    assert send(client, secret, {"tasks": [{"title": "a"}]}, "k-1").status_code == 200
    mark = services.app.max_notification_id()
    other = send(client, secret, {"tasks": [{"title": "b"}]}, "k-1")
    assert other.status_code == 422
    assert other.json["error"] == "idempotency_key_reused"
    assert services.app.max_notification_id() == mark


def start_elsewhere(services, workspace, key, body, lease):
    """The record another request's batch left: begun, not finished."""
    operation = BatchOperation.start(
        workspace.id, key, body_hash(body), len(body["tasks"]), datetime.now(UTC) + lease
    )
    services.app.save_atomically(operation)


def test_a_batch_still_in_flight_is_409_and_one_past_its_lease_runs_again(
    client, services, workspace, member
):
    _, secret = member
    body = {"tasks": [{"external_id": "F-1", "title": "t"}]}
    start_elsewhere(services, workspace, "busy", body, timedelta(minutes=5))
    busy = send(client, secret, body, "busy")
    assert busy.status_code == 409 and busy.json["error"] == "batch_in_progress"
    assert task_created_count(services) == 0
    start_elsewhere(services, workspace, "dead", body, timedelta(seconds=-1))
    taken = send(client, secret, body, "dead")
    assert taken.status_code == 200 and taken.headers["Idempotent-Replayed"] == "false"
    assert taken.json["results"][0]["outcome"] == "created"
    operation = services.app.load(batch_operation_id(workspace.id, "dead"), BatchOperation)
    assert operation.results is not None and operation.results[0]["outcome"] == "created"


def test_a_key_whose_batch_answered_an_error_runs_again(client, services, workspace, member):
    _, secret = member
    body = {"atomic": True, "tasks": [{"external_id": "AB-1", "title": "t", "workflow": "w2"}]}
    refused = send(client, secret, body, "atomic-1")
    assert refused.status_code == 422 and refused.json["error"] == "batch_refused"
    operation = services.app.load(batch_operation_id(workspace.id, "atomic-1"), BatchOperation)
    assert operation.abandoned
    again = send(client, secret, body, "atomic-1")
    assert again.status_code == 422 and again.json["error"] == "batch_refused"


def test_an_unusable_key_is_400_and_writes_nothing(client, services, member):
    _, secret = member
    for key in ("x" * 201, "with space"):
        answer = send(client, secret, {"tasks": [{"title": "t"}]}, key)
        assert answer.status_code == 400, key
        assert answer.json["error"] == "idempotency_key_required"
    assert task_created_count(services) == 0


def test_a_running_batch_renews_its_keys_lease_after_each_window(
    settings, workspace, member, monkeypatch
):
    """With a lease this short (1 us) every window renews it: a batch that outlives
    KANDEV_LEASE_SECONDS keeps its key while it runs (a dead one frees it
    within a lease)."""
    from kandev_es.bootstrap import bootstrap

    principal, _ = member
    short = bootstrap(settings.with_overrides(lease_seconds=1e-6))
    try:
        monkeypatch.setattr("kandev_es.bulk.service.WINDOW", 4)
        body = {"tasks": [{"external_id": f"RN-{n}", "title": "t"} for n in range(10)]}
        result = short.batch.create_many(principal, body, "renewing")
        assert result.summary()["created"] == 10
        operation_id = batch_operation_id(workspace.id, "renewing")
        topics = [
            n.topic.rsplit(".", 1)[1]
            for n in short.app.recorder.select_notifications(start=1, limit=10_000)
            if n.originator_id == operation_id
        ]
        assert topics == ["Started", "Renewed", "Renewed", "Renewed", "Finished"]
    finally:
        short.close()
