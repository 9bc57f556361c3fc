"""Agent fan-out is bounded on a real `kandev-es serve`, both backends: started
with KANDEV_MAX_AGENTS_PER_RUN=1 and KANDEV_MAX_RUN_AGENTS_PER_WORKSPACE=1, a
real agent uses the run credential it finds in its own environment to create
tasks with start_agent over HTTP. Its first child starts; the next create
(over the run's limit) and a second run's create (over the workspace's limit)
answer 429 agent_limit_reached, store nothing and start no process, while a
create without an agent still works. (The in-process version is
tests/integration/test_agent_fanout.py.)"""

from __future__ import annotations

import urllib.parse
import uuid
from typing import Any

from kandev_es.agent.census import running_launches
from kandev_es.agent.processes import stop_run
from kandev_es.bootstrap import bootstrap
from kandev_es.config import data_path
from kandev_es.domain.agent_session import session_id_for
from tests.support.served import ServedProcess, http

WAIT_S = 60.0
AGENTCTL = "/api/v1/agentctl/tasks"
RUN_ID_HEADER = "X-Kandev-Run-Id"


def _run_credential(settings: Any, server: ServedProcess, task_id: str) -> tuple[str, str]:
    """The run token and run id a real agent finds in its environment."""
    session = data_path(settings, "sessions", task_id)
    server.wait_for_file(session / "env.dump", "the agent never wrote env.dump", WAIT_S)
    dumped = (session / "env.dump").read_text().split("\0")
    env = dict(item.split("=", 1) for item in dumped if "=" in item)
    assert env["KANDEV_TASK_ID"] == task_id
    return env["KANDEV_RUN_TOKEN"], env["KANDEV_RUN_ID"]


def _child(server: ServedProcess, credential: tuple[str, str], external_id: str,
           start_agent: bool = True) -> Any:
    token, run_id = credential
    return http("POST", server.base + AGENTCTL, token,
                {"title": "child", "external_id": external_id, "start_agent": start_agent},
                headers={RUN_ID_HEADER: run_id}, timeout=60)


def _found(server: ServedProcess, external_id: str) -> int:
    query = urllib.parse.urlencode({"external_id": external_id})
    url = f"{server.base}/api/v1/workspaces/{server.workspace_id}/tasks/by-external-id?{query}"
    return http("GET", url, server.token).status


def test_a_served_run_over_its_agent_limits_gets_429_storing_and_starting_nothing(
    settings, tmp_path
):
    script = tmp_path / "agent.sh"
    # Dump the environment (the run credential), then live for two minutes at most.
    script.write_text("#!/bin/sh\nenv -0 > env.tmp && mv env.tmp env.dump\nsleep 120\n")
    server = ServedProcess(
        settings, tmp_path / "logs", KANDEV_AGENT_COMMAND=f"/bin/sh {script}",
        KANDEV_MAX_AGENTS_PER_RUN="1", KANDEV_MAX_RUN_AGENTS_PER_WORKSPACE="1",
    )
    runs: list[str] = []
    store = bootstrap(settings)  # reads the served process's store
    agents = data_path(settings, "agents")
    try:
        first_task, first_run = server.start_agent_task("first run")
        second_task, second_run = server.start_agent_task("second run")
        runs += [first_run, second_run]
        first = _run_credential(settings, server, first_task)
        second = _run_credential(settings, server, second_task)
        assert first[1] == first_run and second[1] == second_run

        started = _child(server, first, "C-1")
        assert started.status == 200, started.body
        runs.append(str(session_id_for(uuid.UUID(started.body["id"]))))

        for credential, external_id, scope in ((first, "C-2", "run"),
                                              (second, "C-3", "workspace")):
            before = store.app.max_notification_id()
            running = sorted(launch.run_id for launch in running_launches(agents))
            pidfiles = sorted(path.name for path in agents.glob("*.pid"))
            refused = _child(server, credential, external_id)
            assert refused.status == 429, refused.body
            assert refused.body["error"] == "agent_limit_reached", refused.body
            assert refused.body["details"]["scope"] == scope, refused.body
            assert store.app.max_notification_id() == before, "nothing stored"
            assert _found(server, external_id) == 404, "no task for the refused create"
            assert sorted(launch.run_id for launch in running_launches(agents)) == running, (
                "no agent started")
            assert sorted(path.name for path in agents.glob("*.pid")) == pidfiles, (
                "no launch began")
        assert len(running_launches(agents)) == 3, "two runs and the one child"

        # The limit bounds agents, not tasks.
        plain = _child(server, first, "C-4", start_agent=False)
        assert plain.status == 200, plain.body
        assert _found(server, "C-4") == 200
    finally:
        store.close()
        for run_id in runs:
            stop_run(run_id)
        server.stop()
