"""Which launched agents are running now. Each launch leaves a pidfile
(``<data dir>/agents/<task id>.pid``, written by the agent_launch step) naming
its pid, run, workspace and, for an agent an agent started, the run that
started it; a launch counts while that pid is alive as a process of that run.
So an agent that exits frees its slot at once, whoever reaps it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kandev_es.agent.processes import runs_as


@dataclass(frozen=True)
class Launch:
    run_id: str
    workspace_id: str | None
    # The run whose credential created the task (None: a member's or an admin's create).
    started_by_run: str | None


def running_launches(pidfiles: Path) -> list[Launch]:
    """The launches under ``pidfiles`` whose agent is running now."""
    running = []
    for pidfile in sorted(pidfiles.glob("*.pid")):
        try:
            record = json.loads(pidfile.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # removed meanwhile, or being written
        if not isinstance(record, dict):
            continue
        pid, run_id = record.get("pid"), record.get("run_id")
        if not isinstance(pid, int) or not isinstance(run_id, str) or not runs_as(pid, run_id):
            continue
        workspace, starter = record.get("workspace_id"), record.get("started_by_run")
        running.append(
            Launch(
                run_id,
                workspace if isinstance(workspace, str) else None,
                starter if isinstance(starter, str) else None,
            )
        )
    return running
