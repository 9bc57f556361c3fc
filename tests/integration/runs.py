"""Real agent runs for tests of run-authenticated creates: a task created with
start_agent true through the REST API launches a real agent process, and its
run credential is read from that process's environment (/proc/<pid>/environ)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kandev_es.agent.processes import processes_for_run, stop_run
from kandev_es.domain.agent_session import session_id_for
from tests.integration.helpers import create

RUN_ID_HEADER = "X-Kandev-Run-Id"
ROOT = "/api/v1/office/runtime/tasks"
AGENTCTL = "/api/v1/agentctl/tasks"


@dataclass(frozen=True)
class Run:
    token: str
    run_id: str
    task_id: str
    environment: dict[str, str]

    def headers(self, run_id: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", RUN_ID_HEADER: run_id or self.run_id}


class Runs:
    """Launches agents for one test and stops every one of them at its end."""

    def __init__(self) -> None:
        self.launched: list[str] = []

    def launch(self, client: Any, secret: str, title: str = "agent task") -> Run:
        answer = create(client, secret, title=title, start_agent=True)
        assert answer.status_code == 200, answer.json
        task_id = answer.json["id"]
        run_id = str(session_id_for(uuid.UUID(task_id)))
        self.launched.append(run_id)
        [pid] = processes_for_run(run_id)
        raw = Path(f"/proc/{pid}/environ").read_bytes()
        env = dict(
            item.decode().split("=", 1) for item in raw.split(b"\x00") if b"=" in item
        )
        assert env["KANDEV_RUN_ID"] == run_id and env["KANDEV_TASK_ID"] == task_id
        return Run(env["KANDEV_RUN_TOKEN"], run_id, task_id, env)

    def stop_all(self) -> None:
        for run_id in self.launched:
            stop_run(run_id)
