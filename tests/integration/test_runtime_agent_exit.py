"""The Runtime ends the run credential of an agent it sees has exited, so a
worker that died after launching it (and with it the thread that would have
reaped the agent and revoked) leaves no credential alive until its TTL."""

from __future__ import annotations

import uuid

from kandev_es.agent.processes import processes_for_run, stop_run
from kandev_es.domain.agent_session import session_id_for
from kandev_es.domain.token import ApiToken, run_token_id_for
from tests.integration.helpers import crash_create, create


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
        assert runtime.revoke_exited_agents() == []  # alive: its credential stays
        token = services.app.load(run_token_id_for(run_id), ApiToken)
        assert token is not None and not token.revoked

        stop_run(run_id)  # the agent exits; nobody is left to reap it but the Runtime
        assert runtime.revoke_exited_agents() == [run_id]
        assert revocations(services, run_id) == ["agent_exited"]
        assert runtime.revoke_exited_agents() == []  # once
        assert revocations(services, run_id) == ["agent_exited"]
    finally:
        stop_run(run_id)
