"""Every answer names its request (docs/observability.md: Request ids): the
caller's well-formed X-Request-Id comes back, anything else is replaced; the
id is in every error body, on every log line written while the request is
served, and in the identity's history (the request that claimed, released,
recovered). Both backends, in process."""

from __future__ import annotations

import io
import json
import logging
import re
import time
from collections.abc import Iterator

import pytest

from kandev_es.bootstrap import bootstrap
from kandev_es.domain.external_id import identity_id
from kandev_es.observability import logs, serving
from tests.conftest import bearer
from tests.integration.helpers import crash_create, create, make_git_repository

NEW_ID = re.compile(r"[0-9a-f]{32}")


@pytest.fixture(autouse=True)
def no_request_left() -> None:
    """The test client closes an answer only once it is read (a server always
    does): an earlier test's unread answer may leave its request current."""
    serving.end()


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    """The JSON lines the process writes from now on (what KANDEV_LOG_FORMAT=json gives)."""
    stream = io.StringIO()
    handler = logs.handler("json", stream)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def _post(client, secret: str, body: object, request_id: str | None = None):
    headers = bearer(secret) | ({"X-Request-Id": request_id} if request_id else {})
    # buffered: read whole and closed, as a server does (the access line is written at close)
    return client.post("/api/v1/tasks", json=body, headers=headers, buffered=True)


def test_a_well_formed_caller_id_comes_back_and_any_other_is_replaced(client, member, workspace):
    _, secret = member
    body = {"workspace_id": str(workspace.id), "title": "t"}
    kept = _post(client, secret, body, "webhook-7f3a.delivery:42_b")
    assert kept.status_code == 200, kept.json
    assert kept.headers["X-Request-Id"] == "webhook-7f3a.delivery:42_b"
    for hostile in ("a" * 129, "two words", "quote\"d", "emoji-\u00e9"):
        answered = _post(client, secret, body, hostile)
        assert NEW_ID.fullmatch(answered.headers["X-Request-Id"]), hostile
    assert NEW_ID.fullmatch(_post(client, secret, body).headers["X-Request-Id"])
    assert client.get("/healthz").headers["X-Request-Id"]


def test_every_error_body_carries_the_id_its_header_carries(client, member, operator, workspace):
    _, secret = member
    _, operator_secret = operator
    answers = [
        client.post("/api/v1/tasks", data=b"{not json", headers=bearer(secret)),  # typed 400
        _post(client, "kes_wrong", {"title": "t"}, "caller-1"),  # 404 task not created
        client.get("/api/v1/no-such-route", headers=bearer(secret)),  # werkzeug's 404
        client.delete(  # release with no holder: the stored answer
            f"/api/v1/workspaces/{workspace.id}/tasks/by-external-id",
            query_string={"external_id": "NOBODY"},
            headers=bearer(operator_secret) | {"Idempotency-Key": "op-1"},
        ),
    ]
    for answer in answers:
        assert answer.status_code in (400, 404), answer.json
        assert answer.json["request_id"] == answer.headers["X-Request-Id"], answer.json
    assert answers[1].json["request_id"] == "caller-1"


def test_each_log_line_of_a_request_carries_its_id_route_and_workspace(
    client, member, workspace, log_lines
):
    _, secret = member
    body = {"workspace_id": str(workspace.id), "title": "t", "external_id": "LOG-1"}
    assert _post(client, secret, body, "follow-me-1").status_code == 200
    lines = _lines(log_lines)
    claimed = [line for line in lines if line["message"].startswith("claimed ")]
    assert claimed and all(line["request_id"] == "follow-me-1" for line in claimed), lines
    assert claimed[0]["workspace"] == str(workspace.id)
    assert claimed[0]["route"] == "/api/v1/tasks"
    [access] = [line for line in lines if line["logger"] == "kandev_es.access"]
    assert access["request_id"] == "follow-me-1" and access["status"] == 200
    assert access["route"] == "/api/v1/tasks" and access["duration"] >= 0
    assert '"POST /api/v1/tasks' in access["message"]
    assert set(logs.JSON_KEYS) <= set(access)


def test_the_identity_history_names_the_requests_that_claimed_and_released(
    client, member, operator, workspace
):
    _, secret = member
    _, operator_secret = operator
    body = {"workspace_id": str(workspace.id), "title": "t", "external_id": "HIST-1"}
    created = _post(client, secret, body, "claim-req-1")
    assert created.status_code == 200, created.json
    handle = created.json["creation_handle"]
    status = client.get(f"/api/v1/creations/{handle}", headers=bearer(secret))
    assert status.json["request_id"] == "claim-req-1"
    released = client.delete(
        f"/api/v1/workspaces/{workspace.id}/tasks/by-external-id",
        query_string={"external_id": "HIST-1"},
        headers=bearer(operator_secret) | {"Idempotency-Key": "op-2", "X-Request-Id": "rel-1"},
    )
    assert released.status_code == 200, released.json
    history = client.get(
        f"/api/v1/workspaces/{workspace.id}/identities/history",
        query_string={"external_id": "HIST-1"},
        headers=bearer(operator_secret),
    ).json
    by_kind = {event["event"]: event for event in history["events"]}
    assert by_kind["Claimed"]["request_id"] == "claim-req-1"
    assert by_kind["Released"]["request_id"] == "rel-1"


def test_the_runtime_recovers_a_creation_under_its_claiming_request_id(
    settings, client, services, member, workspace, tmp_path, log_lines
):
    _, secret = member
    repo = make_git_repository(tmp_path / "backend")
    services.repositories.register(workspace.id, "backend", str(repo))
    body = {"external_id": "REC-1", "title": "t", "repositories": ["backend"]}
    crash_create(settings, secret, body, "repository:after", lease=0.5, request_id="dies-1")
    time.sleep(0.7)
    short = bootstrap(services.settings.with_overrides(lease_seconds=0.5))
    try:
        [recovery] = short.runtime().recover_once()
    finally:
        short.close()
    assert recovery.phase == "completed"
    recovering = [line for line in _lines(log_lines) if line["logger"] == "kandev_es.runtime"]
    assert recovering and all(line["request_id"] == "dies-1" for line in recovering), recovering
    assert create(client, secret, **body).json["outcome"] == "found_settled"
    events = services.app.events.get(identity_id(workspace.id, "REC-1"))
    kinds = {type(event).__name__: event for event in events}
    assert kinds["Claimed"].request_id == "dies-1"
    assert kinds["RecoveryClaimed"].request_id == "dies-1"
