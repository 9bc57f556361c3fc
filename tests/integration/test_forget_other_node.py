"""Forgetting on one node erases on every node (issue 47, point 1: "snapshots
and caches on every node"): a node that read the task before, so holds its
data key in memory, shows none of the erased free text afterwards -- not in
the task, the identity's history, a lookup, nor a retried create."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kandev_es.bootstrap import Services, bootstrap
from kandev_es.config import Settings
from tests.conftest import bearer
from tests.integration.helpers import create
from tests.integration.test_forget import forget

MARKER = "Okapi-Marker-5150"


@pytest.fixture
def other_node(settings: Settings) -> Iterator[Services]:
    node = bootstrap(settings)
    yield node
    node.close()


def reads(client: Any, secret: str, workspace_id: Any, task_id: str) -> list[str]:
    """Every read of the task a client of a node may make, as text."""
    headers = bearer(secret)
    query = {"external_id": "ERASE-N"}
    answers = [  # the identity's history first: it does not read the task's stream
        client.get(f"/api/v1/workspaces/{workspace_id}/identities/history", query_string=query,
                   headers=headers),
        client.get(f"/api/v1/workspaces/{workspace_id}/tasks/by-external-id", query_string=query,
                   headers=headers),
        client.get(f"/api/v1/tasks/{task_id}", headers=headers),
    ]
    for answer in answers:
        assert answer.status_code == 200, (answer.request.path, answer.json)
    return [answer.get_data(as_text=True) for answer in answers]


def test_a_node_that_read_the_task_shows_none_of_it_after_another_node_forgot_it(
    client: Any, other_node: Services, workspace: Any, member: Any, operator: Any
) -> None:
    from kandev_es.api import create_app

    elsewhere = create_app(services=other_node, run_projections=False).test_client()
    made = create(client, member[1], external_id="ERASE-N", title=f"{MARKER} title",
                  description=f"{MARKER} description")
    assert made.status_code == 200, made.json
    task_id = made.json["id"]
    before = reads(elsewhere, operator[1], workspace.id, task_id)
    assert MARKER in before[0] and MARKER in before[2]  # it read (and kept) the key

    assert forget(client, operator[1], task_id).status_code == 200

    for text in reads(elsewhere, operator[1], workspace.id, task_id):
        assert MARKER not in text
    retried = create(elsewhere, member[1], external_id="ERASE-N", title="retry")
    assert retried.status_code == 200, retried.json
    assert retried.json["title"] is None and MARKER not in retried.get_data(as_text=True)


def release(client: Any, secret: str, workspace_id: Any, key: str) -> Any:
    return client.delete(
        f"/api/v1/workspaces/{workspace_id}/tasks/by-external-id?external_id=ERASE-N",
        headers={**bearer(secret), "Idempotency-Key": key},
    )


def test_a_release_replayed_after_the_forget_answers_without_the_erased_text_on_every_node(
    client: Any, other_node: Services, workspace: Any, member: Any, operator: Any
) -> None:
    """A release's stored answer is the task as it was; a replay of it once the
    task is forgotten shows its free text as forgotten, on the node that
    released it (which kept the operation in memory) and on any other."""
    from kandev_es.api import create_app

    elsewhere = create_app(services=other_node, run_projections=False).test_client()
    made = create(client, member[1], external_id="ERASE-N", title=f"{MARKER} title",
                  description=f"{MARKER} description")
    assert made.status_code == 200, made.json
    first = release(client, operator[1], workspace.id, "rel-n")
    assert first.status_code == 200 and first.json["title"] == f"{MARKER} title"
    again = release(elsewhere, operator[1], workspace.id, "rel-n")
    assert again.json["title"] == first.json["title"]

    assert forget(client, operator[1], made.json["id"]).status_code == 200

    for node in (client, elsewhere):
        replayed = release(node, operator[1], workspace.id, "rel-n")
        assert replayed.status_code == 200, replayed.json
        assert replayed.headers["Idempotent-Replayed"] == "true"
        assert replayed.json["title"] is None and replayed.json["description"] is None
        assert MARKER not in replayed.get_data(as_text=True)


def test_a_found_retry_on_a_node_that_never_read_the_task_reads_its_key_once(
    client: Any, other_node: Services, member: Any
) -> None:
    """No node keeps keys between reads, so a node's first read of a task asks
    the store for its key: once for the whole create (identity, then task)."""
    from kandev_es.api import create_app

    elsewhere = create_app(services=other_node, run_projections=False).test_client()
    made = create(client, member[1], external_id="ERASE-N", title=f"{MARKER} title")
    assert made.status_code == 200, made.json
    keys = other_node.app.keys
    reader, calls = keys.reader, []
    keys.reader = lambda wanted: calls.append(list(wanted)) or reader(wanted)
    try:
        found = create(elsewhere, member[1], external_id="ERASE-N", title="retry")
    finally:
        keys.reader = reader
    assert found.status_code == 200 and found.json["title"] == f"{MARKER} title"
    assert [len(wanted) for wanted in calls] == [1]
