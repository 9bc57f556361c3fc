"""Ends the run credential of every launched agent whose processes are gone.
The launching worker's reaper thread revokes when its agent exits; a worker
that died took that thread with it, and without this the credential would
live until its TTL. The pidfiles agent launch writes say which runs were
launched; /proc says which still run.

A settled run (exited, credential revoked) loses its pidfile, so the agents
directory does not grow with every run. Not while its task is still
preparing: then the pidfile is the launch step's witness, which a recovering
owner reconnects through (creation/steps/agent_launch.py reconcile); once the
creation settles the step's evidence is in the event store. A still-running
agent keeps its pidfile, and the log next to it stays."""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from pathlib import Path

from kandev_es.agent.processes import live_run_ids
from kandev_es.application import Tasks
from kandev_es.creation.steps.base import RunCredentials
from kandev_es.domain.task import TASK_PREPARING, Task
from kandev_es.errors import StoreUnavailable

log = logging.getLogger("kandev_es.runtime")


class ExitedAgents:
    def __init__(self, pidfiles: Path, credentials: RunCredentials, app: Tasks) -> None:
        self._pidfiles = pidfiles
        self._credentials = credentials
        self._app = app

    def _launched(self) -> dict[Path, str]:
        """{pidfile: run id} of every pidfile there."""
        runs = {}
        for pidfile in sorted(self._pidfiles.glob("*.pid")):
            try:
                run_id = json.loads(pidfile.read_text(encoding="utf-8")).get("run_id")
            except (OSError, ValueError, AttributeError):
                continue  # removed meanwhile, or being written
            if isinstance(run_id, str):
                runs[pidfile] = run_id
        return runs

    def _creation_unsettled(self, pidfile: Path) -> bool:
        try:
            task_id = uuid.UUID(pidfile.stem)  # agent_launch names it <task id>.pid
        except ValueError:
            return False
        task = self._app.read(task_id, Task)
        # Claimed and Task.Created share one save: no task, no creation in flight.
        return task is not None and task.phase == TASK_PREPARING

    def revoke_exited(self) -> list[str]:
        """One scan; the runs whose credential this call revoked."""
        launched = self._launched()
        if not launched:
            return []
        alive = live_run_ids()
        revoked = []
        for pidfile, run_id in launched.items():
            if run_id in alive:
                continue
            try:
                if self._credentials.revoke_run(run_id, "agent_exited"):
                    log.info("revoked the run credential of exited agent run=%s", run_id)
                    revoked.append(run_id)
                if not self._creation_unsettled(pidfile):
                    with contextlib.suppress(FileNotFoundError):
                        pidfile.unlink()
            except StoreUnavailable:
                raise  # every other run would meet the outage too
            except Exception:  # one run's failure never keeps the others' credentials alive
                log.exception("revoking the run credential of run=%r failed", run_id)
        return revoked
