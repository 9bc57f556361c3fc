"""Small helpers shared by integration tests."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from kandev_es.bootstrap import Services
from kandev_es.domain.external_id import identity_id
from kandev_es.domain.identity import Identity
from kandev_es.domain.task import Task
from tests.conftest import bearer
from tests.support.tasks import bare_task


def create(client: Any, secret: str, **body: Any) -> Any:
    return client.post("/api/v1/tasks", json=body, headers=bearer(secret))


# The topics of a task's creation event, and of the event a task.created feed
# entry comes from: Task.Activated, or Task.CreatedActive (a creation without
# effects, completed in the save that created its task).
TASK_BORN = ("Task.Created", "Task.CreatedActive")
TASK_CREATED_SOURCES = ("Task.Activated", "Task.CreatedActive")


def upload(
    client: Any, workspace: Any, secret: str, content: bytes, name: str, content_type: str
) -> Any:
    """An attachment uploaded to ``workspace`` (201): its representation."""
    answer = client.post(
        f"/api/v1/workspaces/{workspace.id}/attachments",
        query_string={"filename": name},
        data=content,
        headers={**bearer(secret), "Content-Type": content_type},
    )
    assert answer.status_code == 201, answer.json
    return answer.json


def task_created_count(services: Services) -> int:
    """How many Task.Created (or CreatedActive) events the store holds (the ground truth)."""
    count = 0
    for notification in services.app.recorder.select_notifications(start=1, limit=1_000_000):
        if notification.topic.endswith(TASK_BORN):
            count += 1
    return count


def start_unsettled_creation(services: Services, workspace: Any, external_id: str) -> Task:
    """Write a real preparing tenure — a creation that claimed and has not yet
    completed — the state another create sees while one is in flight."""
    identity = Identity.register(identity_id(workspace.id, external_id), workspace.id, external_id)
    task = bare_task(
        uuid.uuid4(),
        workspace_id=workspace.id,
        identity_id=identity.id,
        identifier=f"{workspace.task_prefix}-999",
        external_id=external_id,
        title="in flight",
        created_by="token:other",
    )
    identity.claim(
        task_id=task.id,
        owner_id="another-process",
        actor="token:other",
        plan={"workspace_id": str(workspace.id), "external_id": external_id, "steps": []},
        plan_hash="0" * 64,
        lease_expires_at=datetime.now(UTC) + timedelta(minutes=5),
    )
    services.app.save_atomically(identity, task)
    return task


def make_git_repository(path: Any) -> Any:
    """A real git repository with one commit."""
    import subprocess

    path.mkdir(parents=True, exist_ok=True)
    for args in (
        ["init", "-q", "-b", "main"],
        ["config", "user.email", "tests@kandev-es.local"],
        ["config", "user.name", "kandev-es tests"],
    ):
        subprocess.run(["git", "-C", str(path), *args], check=True)
    (path / "README.md").write_text("hello\n")
    subprocess.run(["git", "-C", str(path), "add", "README.md"], check=True)
    subprocess.run(["git", "-C", str(path), "commit", "-q", "-m", "init"], check=True)
    return path


def branches(path: Any) -> list[str]:
    import subprocess

    out = subprocess.run(
        ["git", "-C", str(path), "branch", "--format=%(refname:short)"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return sorted(line for line in out.splitlines() if line)


def worktrees(path: Any) -> list[str]:
    import subprocess

    out = subprocess.run(
        ["git", "-C", str(path), "worktree", "list", "--porcelain"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("worktree ")][1:]


def crash_create(
    settings: Any,
    secret: str,
    body: dict,
    failpoint: str,
    lease: float = 1.0,
    request_id: str = "",
) -> None:
    """One create in a separate process that SIGKILLs itself at ``failpoint``
    (tests/support/crashing_create.py): an owner that dies for real, serving
    the request ``request_id`` when one is given."""
    import dataclasses
    import json
    import subprocess
    import sys

    raw = dataclasses.asdict(settings.with_overrides(failpoint=failpoint, lease_seconds=lease))
    raw["data_dir"] = str(raw["data_dir"])
    raw["repository_roots"] = [str(root) for root in raw["repository_roots"]]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.crashing_create",
            json.dumps(raw),
            secret,
            json.dumps(body),
            request_id,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == -9, (result.returncode, result.stdout, result.stderr[-2000:])


class PausedCreation:
    """A create run by the ``paused_owner`` fixture's process-alike in a thread
    of its own, held at its pause (the workspace gets a WIP policy so that the
    policy step, where it pauses, runs). ``finish`` lets it go and gives what
    the create returned (its response) or raised."""

    def __init__(
        self,
        client: Any,
        workspace: Any,
        admin_secret: str,
        paused_owner: Any,
        secret: str,
        body: dict,
    ) -> None:
        slow, wait_until_paused, self._resume = paused_owner
        client.put(
            f"/api/v1/workspaces/{workspace.id}/policy",
            json={"wip_limit": 10},
            headers=bearer(admin_secret),
        )
        principal = slow.tokens.authenticate(secret)
        self._result: dict[str, Any] = {}

        def owner() -> None:
            try:
                self._result["outcome"] = slow.creation.create(principal, body).to_response()
            except Exception as error:
                self._result["error"] = error

        self._thread = threading.Thread(target=owner)
        self._thread.start()
        wait_until_paused()

    def finish(self) -> tuple[dict | None, Exception | None]:
        self._resume()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "the paused create never finished"
        return self._result.get("outcome"), self._result.get("error")
