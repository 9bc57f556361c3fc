"""`kandev-es agentctl task create` from a real agent process, launched by a
real `kandev-es serve`, with the run credential its launch put in its
environment: the first call creates, the retry finds the same task (AC-1,
AC-3). Runs on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from kandev_es.agent.processes import stop_run
from kandev_es.config import data_path
from kandev_es.errors import NOT_VALID_FOR_WORKSPACE
from tests.support.errors import without_request_id
from tests.support.served import ServedProcess, http, kandev_command

WAIT_S = 60.0
AGENTCTL = "agentctl task create --title from-agent --external-id AGENT-1"


def agent_script(tmp_path: Path) -> Path:
    """The agent: agentctl twice, both answers and exit codes into its cwd."""
    command = f"{shlex.join(kandev_command())} {AGENTCTL}"
    script = tmp_path / "agent.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"{command} > first.json; echo $? > first.rc\n"
        f"{command} > second.json; echo $? > second.rc\n"
        "cat first.json second.json > agentctl.out\n"
        "touch agentctl.done\n",
        encoding="utf-8",
    )
    return script


@pytest.fixture
def served(settings, tmp_path):
    command = f"sh {agent_script(tmp_path)}"
    server = ServedProcess(settings, tmp_path, KANDEV_AGENT_COMMAND=command)
    launched: list[str] = []
    yield server, launched
    for run_id in launched:
        stop_run(run_id)
    server.stop()


def test_agentctl_from_a_real_agent_creates_then_finds_the_same_task(settings, served):
    server, launched = served
    parent_id, run_id = server.start_agent_task("run an agent")
    launched.append(run_id)
    cwd = data_path(settings, "sessions", parent_id)
    server.wait_for_file(cwd / "agentctl.done", "agent never finished", WAIT_S)
    first = json.loads((cwd / "first.json").read_text())
    second = json.loads((cwd / "second.json").read_text())
    assert [(cwd / name).read_text().strip() for name in ("first.rc", "second.rc")] == ["0", "0"]
    assert (cwd / "agentctl.out").read_text().count("\n") == 2
    assert (first["outcome"], first["deduplicated"], first["creation_complete"]) == (
        "created", False, True,
    )
    assert (second["outcome"], second["deduplicated"], second["creation_complete"]) == (
        "found_settled", True, True,
    )
    assert second["id"] == first["id"] and first["id"] != parent_id
    task = http("GET", f"{server.base}/api/v1/tasks/{first['id']}", server.token)
    assert task.status == 200
    assert (task.body["title"], task.body["external_id"]) == ("from-agent", "AGENT-1")
    assert task.body["workspace_id"] == server.workspace_id
    lookup = http(
        "GET",
        f"{server.base}/api/v1/workspaces/{server.workspace_id}/tasks/by-external-id"
        "?external_id=AGENT-1",
        server.token,
    )
    assert lookup.status == 200 and lookup.body["id"] == first["id"]


def agentctl(**env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KANDEV_")}
    return subprocess.run(
        [*kandev_command(), *shlex.split(AGENTCTL)],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_agentctl_with_a_non_run_token_exits_nonzero_with_the_error_json(served):
    server, _ = served
    result = agentctl(
        KANDEV_API_URL=server.base, KANDEV_RUN_TOKEN=server.token or "", KANDEV_RUN_ID="nope"
    )
    assert result.returncode == 1, result.stderr
    assert without_request_id(json.loads(result.stdout)) == {
        "error": "task not created", "message": NOT_VALID_FOR_WORKSPACE
    }


def test_agentctl_outside_an_agent_names_the_missing_variables():
    result = agentctl(KANDEV_API_URL="http://127.0.0.1:9")
    assert result.returncode == 2
    answer = json.loads(result.stdout)
    assert answer["error"] == "no_run_credential"
    assert answer["message"].startswith("missing KANDEV_RUN_TOKEN, KANDEV_RUN_ID:")
