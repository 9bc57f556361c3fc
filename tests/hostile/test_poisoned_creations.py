"""Poisoned creations against a real `kandev-es serve` process, both backends:
a repository name with a trailing newline or a folder inside an enclosing clone
is refused (422); a repository an older version stored as "inbox\\n" (whose
worktree is made but can never be proven) ends every creation that uses it —
the request's own with a typed 502 after KANDEV_STEP_ATTEMPTS runs, a dead
owner's through the served Runtime — within the event bound, the identity
free; meanwhile the service keeps serving health checks and other creates."""

from __future__ import annotations

import time
import urllib.parse
import uuid

import pytest

from kandev_es.bootstrap import bootstrap
from kandev_es.config import Settings
from kandev_es.creation.driver import event_bound
from kandev_es.domain.external_id import identity_id
from kandev_es.domain.workspace import Workspace
from tests.integration.helpers import branches, crash_create, make_git_repository
from tests.support.served import ServedProcess, http

BOUND = event_bound(1, Settings.step_attempts, Settings.recovery_attempts, resumes=0)


@pytest.fixture
def server(settings, tmp_path):
    served = ServedProcess(settings, tmp_path)
    yield served
    served.stop()


def lookup_status(server, external_id: str) -> int:
    query = urllib.parse.urlencode({"external_id": external_id})
    url = f"{server.base}/api/v1/workspaces/{server.workspace_id}/tasks/by-external-id?{query}"
    return http("GET", url, server.token).status


def identity_event_count(services, key) -> int:
    return sum(
        1
        for notification in services.app.recorder.select_notifications(start=1, limit=1_000_000)
        if notification.originator_id == key
    )


def test_poisoned_repositories_end_their_creations_and_the_service_keeps_serving(
    settings, server, tmp_path
):
    base, token, ws = server.base, server.token, server.workspace_id
    repositories = f"{base}/api/v1/workspaces/{ws}/repositories"
    good = make_git_repository(tmp_path / "backend")
    poisoned = make_git_repository(tmp_path / "inbox")
    enclosing = make_git_repository(tmp_path / "clone")
    (enclosing / "repos" / "inbox").mkdir(parents=True)

    refused = http("POST", repositories, token, {"name": "inbox\n", "path": str(poisoned)})
    assert (refused.status, refused.body["error"]) == (422, "validation_failed")
    inside = http("POST", repositories, token,
                  {"name": "inbox", "path": str(enclosing / "repos" / "inbox")})
    assert (inside.status, inside.body["error"]) == (422, "repository_not_top_level")
    assert branches(enclosing) == ["main"]
    made = http("POST", repositories, token, {"name": "backend", "path": str(good)})
    assert made.status == 201, made.body

    older = bootstrap(settings)  # an older version's worker, which accepted "inbox\n"
    try:
        workspace = older.app.load(uuid.UUID(ws), Workspace)
        workspace.trigger_event(
            Workspace.RepositoryRegistered, name="inbox\n", path=str(poisoned)
        )
        older.app.save_atomically(workspace)

        # The request that uses it ends, typed, with the identity free.
        started = time.monotonic()
        answer = http("POST", f"{base}/api/v1/tasks", token,
                      {"workspace_id": ws, "external_id": "P-1", "title": "t",
                       "repositories": ["inbox\n"]}, timeout=60)
        assert (answer.status, answer.body["error"]) == (502, "effect_unproven"), answer.body
        assert time.monotonic() - started < 60
        assert lookup_status(server, "P-1") == 404

        # A dead owner's creation that uses it: the served Runtime ends it.
        crash_create(settings, token, {"workspace_id": ws, "external_id": "P-2", "title": "t",
                                       "repositories": ["inbox\n"]}, "claim:after")
        assert lookup_status(server, "P-2") == 200  # found_unsettled, for now
        deadline = time.monotonic() + 120
        served = 0
        while lookup_status(server, "P-2") != 404:
            assert time.monotonic() < deadline, "P-2 never ended:\n" + server.log()
            assert http("GET", f"{base}/healthz", timeout=5).status == 200
            other = http("POST", f"{base}/api/v1/tasks", token,
                         {"workspace_id": ws, "external_id": f"Q-{served}", "title": "t",
                          "repositories": ["backend"]}, timeout=30)
            assert (other.status, other.body["outcome"]) == (200, "created"), other.body
            served += 1
            time.sleep(0.5)

        for external_id in ("P-1", "P-2"):
            key = identity_id(uuid.UUID(ws), external_id)
            count = identity_event_count(older, key)
            assert count <= BOUND
        assert branches(poisoned) == ["main"]  # compensated: nothing of theirs is left
        assert server.process.poll() is None
    finally:
        older.close()
