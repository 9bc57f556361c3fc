"""Ends the run credential of every launched agent whose processes are gone.
The launching worker's reaper thread revokes when its agent exits; a worker
that died took that thread with it, and without this the credential would
live until its TTL. The pidfiles agent launch writes say which runs were
launched; /proc says which still run."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from kandev_es.agent.processes import live_run_ids
from kandev_es.creation.steps.base import RunCredentials

log = logging.getLogger("kandev_es.runtime")


class ExitedAgents:
    def __init__(self, pidfiles: Path, credentials: RunCredentials) -> None:
        self._pidfiles = pidfiles
        self._credentials = credentials
        # Pidfiles stay after their run ends, and a revoked run credential is
        # never reissued: each one is settled once and not read again.
        self._settled: set[str] = set()

    def _launched(self) -> dict[str, str]:
        """{pidfile name: run id} of every pidfile not settled yet."""
        runs = {}
        for pidfile in sorted(self._pidfiles.glob("*.pid")):
            if pidfile.name in self._settled:
                continue
            try:
                run_id = json.loads(pidfile.read_text(encoding="utf-8")).get("run_id")
            except (OSError, ValueError, AttributeError):
                continue  # removed meanwhile, or being written
            if isinstance(run_id, str):
                runs[pidfile.name] = run_id
        return runs

    def revoke_exited(self) -> list[str]:
        """One scan; the runs whose credential this call revoked."""
        launched = self._launched()
        if not launched:
            return []
        alive = live_run_ids()
        revoked = []
        for name, run_id in launched.items():
            if run_id in alive:
                continue
            if self._credentials.revoke_run(run_id, "agent_exited"):
                log.info("revoked the run credential of exited agent run=%s", run_id)
                revoked.append(run_id)
            self._settled.add(name)
        return revoked
