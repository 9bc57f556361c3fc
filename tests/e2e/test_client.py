"""kandev_es.client against a real served process: typed outcomes, safe retries
(including across a server restart), lookup/get/update, release and the feed."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from kandev_es.client import Client, ClientError, DeadlineExceeded, Outcome
from tests.support.served import ServedProcess, free_port


@pytest.fixture
def server(settings, tmp_path):
    served = ServedProcess(settings, tmp_path, workers=1)
    try:
        yield served
    finally:
        served.stop()


def test_create_then_retry_is_found_and_lookup_get_update(server):
    with Client(server.base, server.token) as client:
        first = client.create_task(server.workspace_id, "First", external_id="JIRA-1")
        again = client.create_task(server.workspace_id, "First", external_id="JIRA-1")
        assert first.outcome is Outcome.CREATED
        assert again.outcome is Outcome.FOUND_SETTLED
        assert again.task["id"] == first.task["id"]
        held = client.lookup(server.workspace_id, "JIRA-1")
        assert held is not None and held["id"] == first.task["id"]
        assert client.lookup(server.workspace_id, "jira-1") is None
        task = client.get(first.task["id"])
        updated = client.update(task["id"], {"title": "Renamed"}, revision=task["revision"])
        assert updated["title"] == "Renamed"


def test_bad_input_is_a_typed_error_and_not_retried(server):
    with Client(server.base, server.token) as client:
        with pytest.raises(ClientError) as caught:
            client.create_task(server.workspace_id, "", external_id="BAD-1")
        assert (caught.value.status, caught.value.code) == (422, "validation_failed")
        assert client.lookup(server.workspace_id, "BAD-1") is None


def test_release_requires_an_operation_id(server):
    with Client(server.base, server.token) as client, pytest.raises(ValueError):
        client.release(server.workspace_id, "JIRA-1", operation_id="")


def test_connection_refused_until_deadline_raises(tmp_path):
    client = Client(f"http://127.0.0.1:{free_port()}", "kes_none", deadline=0.5)
    with client, pytest.raises(DeadlineExceeded):
        client.create_task(str(uuid.uuid4()), "t", external_id="X-1")


def test_create_retries_across_a_server_restart(settings, tmp_path):
    served = ServedProcess(settings, tmp_path, workers=1)
    token, workspace, port = served.token, served.workspace_id, served.port
    served.stop()
    results: list = []

    def create() -> None:
        with Client(served.base, token, deadline=60) as client:
            results.append(client.create_task(workspace, "Across", external_id="R-1"))

    worker = threading.Thread(target=create)
    worker.start()
    time.sleep(0.5)  # let the client meet a refused connection first
    restarted = ServedProcess(settings, tmp_path, workers=1, port=port)
    try:
        worker.join(timeout=60)
        assert results and results[0].outcome is Outcome.CREATED
        assert results[0].attempts > 1
        with Client(restarted.base, token) as client:
            again = client.create_task(workspace, "Across", external_id="R-1")
        assert again.outcome is Outcome.FOUND_SETTLED
        assert again.task["id"] == results[0].task["id"]
    finally:
        restarted.stop()


def test_release_with_an_operation_id_replays(server):
    with Client(server.base, server.token) as client:
        client.create_task(server.workspace_id, "To release", external_id="REL-1")
        first = client.release(server.workspace_id, "REL-1", operation_id="op-1")
        again = client.release(server.workspace_id, "REL-1", operation_id="op-1")
        assert first == again
        assert client.lookup(server.workspace_id, "REL-1") is None


def test_feed_resumes_after_the_connection_ends(server):
    with Client(server.base, server.token, deadline=30) as client:
        first = client.create_task(server.workspace_id, "One", external_id="F-1").task
        events = client.feed(server.workspace_id, stream_seconds=1)
        seen = next(events)
        assert first["id"] in str(seen.data)
        time.sleep(1.5)  # the server has ended that connection by now
        second = client.create_task(server.workspace_id, "Two", external_id="F-2").task
        following = next(events)
        assert second["id"] in str(following.data)
        assert int(following.id) > int(seen.id)
