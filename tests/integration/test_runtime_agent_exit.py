"""The Runtime ends the run credential of an agent it sees has exited, so a
worker that died after launching it (and with it the thread that would have
reaped the agent and revoked) leaves no credential alive until its TTL. Then it
deletes the run's pidfile, so <data dir>/agents/ does not grow with every run —
but not while the run's creation is unsettled: there the pidfile is the launch
step's witness a recovering owner reconnects through."""

from __future__ import annotations

import time
import uuid

from kandev_es.agent.processes import processes_for_run, stop_run
from kandev_es.config import data_path
from kandev_es.domain.agent_session import session_id_for
from kandev_es.domain.task import TASK_ACTIVE, Task
from kandev_es.domain.token import ApiToken, run_token_id_for
from tests.integration.helpers import crash_create, create

LEASE = 1.0  # crash_create's lease


def revocations(services, run_id: str) -> list[str]:
    events = services.app.repository.event_store.get(run_token_id_for(run_id))
    return [e.reason for e in events if type(e).__name__ == "Revoked"]


def test_runtime_revokes_the_credential_of_an_agent_that_exited_after_its_worker_died(
    settings, client, services, workspace, member, monkeypatch
):
    monkeypatch.setenv("KANDEV_DEMO_AGENT_SECONDS", "120")
    _, secret = member
    body = {"external_id": "AX-1", "title": "t", "start_agent": True}
    # The worker launches the agent (detached), then dies before anything else.
    crash_create(settings, secret, body, "agent_launch:after")
    task_id = uuid.UUID(create(client, secret, **body).json["id"])
    run_id = str(session_id_for(task_id))
    runtime = services.runtime()
    try:
        assert processes_for_run(run_id), "the agent outlives its worker"
        pidfile = data_path(settings, "agents", f"{task_id}.pid")
        assert runtime.revoke_exited_agents() == []  # alive: its credential stays
        assert pidfile.is_file(), "a running agent keeps its pidfile"
        token = services.app.load(run_token_id_for(run_id), ApiToken)
        assert token is not None and not token.revoked

        stop_run(run_id)  # the agent exits; nobody is left to reap it but the Runtime
        assert runtime.revoke_exited_agents() == [run_id]
        assert revocations(services, run_id) == ["agent_exited"]
        assert pidfile.is_file(), "its creation is unsettled (the owner died): kept"
        assert runtime.revoke_exited_agents() == []  # once
        assert revocations(services, run_id) == ["agent_exited"]
    finally:
        stop_run(run_id)


def test_an_exited_agent_of_an_unsettled_creation_keeps_its_pidfile_until_it_settles(
    settings, client, services, workspace, member, monkeypatch
):
    monkeypatch.setenv("KANDEV_DEMO_AGENT_SECONDS", "120")
    _, secret = member
    body = {"external_id": "AX-2", "title": "t", "start_agent": True}
    crash_create(settings, secret, body, "agent_launch:after")  # owner dead, task preparing
    (pidfile,) = data_path(settings, "agents").glob("*.pid")
    task_id = uuid.UUID(pidfile.stem)
    run_id = str(session_id_for(task_id))
    runtime = services.runtime()
    try:
        stop_run(run_id)
        assert runtime.revoke_exited_agents() == [run_id]
        assert pidfile.is_file(), "the launch step's witness while the creation is unsettled"
        # The Runtime takes over the dead owner's creation and reconnects to the
        # launch through the pidfile (no second launch on a revoked credential).
        time.sleep(LEASE + 0.2)
        [recovery] = runtime.recover_once()
        assert recovery.phase == "completed"
        task = services.app.load(task_id, Task)
        assert task is not None and task.phase == TASK_ACTIVE
        assert runtime.revoke_exited_agents() == []
        assert not pidfile.exists(), "settled now: deleted"
        assert revocations(services, run_id) == ["agent_exited"]
    finally:
        stop_run(run_id)


def test_a_run_reaped_by_its_worker_loses_its_pidfile_on_the_next_scan(
    client, settings, services, workspace, member, monkeypatch
):
    monkeypatch.setenv("KANDEV_DEMO_AGENT_SECONDS", "120")
    _, secret = member
    made = create(client, secret, external_id="AX-3", title="t", start_agent=True)
    assert made.status_code == 200, made.json
    task_id = uuid.UUID(made.json["id"])
    run_id = str(session_id_for(task_id))
    pidfile = data_path(settings, "agents", f"{task_id}.pid")
    runtime = services.runtime()
    try:
        assert runtime.revoke_exited_agents() == [] and pidfile.is_file()
        stop_run(run_id)
        runtime.revoke_exited_agents()  # the reaper thread or this scan revokes
        assert revocations(services, run_id) == ["agent_exited"]
        assert not pidfile.exists()
        assert data_path(settings, "agents", f"{task_id}.log").is_file(), "the log stays"
    finally:
        stop_run(run_id)
