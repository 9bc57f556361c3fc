"""Recovery: time from a SIGKILL right after a Claim to the identity answering
found_settled, settled by `kandev-es runtime --once`."""

from __future__ import annotations

import http.client
import subprocess
import time
from pathlib import Path
from typing import Any

from benchlib.common import WAIT_S, body
from benchlib.server import Client, Gunicorn, environment, kandev
from kandev_es.bootstrap import Services


def recovery(url: str, tmp: Path, services: Services) -> dict[str, Any]:
    """SIGKILL of the worker right after its Claim; then `kandev-es runtime --once`
    (1 s lease) until the identity's lookup answers found_settled. The workspace
    has a WIP limit, so the plan has a step to recover (a plan without effects
    is claimed and completed in one transaction: nothing would be left)."""
    data_dir = tmp / "recovery-data"
    env = environment(
        url, data_dir,
        KANDEV_FAILPOINT="claim:after", KANDEV_LEASE_SECONDS="1", KANDEV_RUNTIME_IN_PROCESS="n",
    )
    workspace = services.workspaces.open("bench-recovery", "REC")
    services.workspaces.set_wip_limit(workspace.id, 1000)
    token, _ = services.tokens.issue(workspace_id=workspace.id, admin=False)
    server = Gunicorn(env, 1, tmp / "gunicorn-recovery.log")
    try:
        try:
            status, reply = Client(server.port, token).request(
                "POST", "/api/v1/tasks", body(workspace.id, "CRASH-1", "crash")
            )
            return {"error": f"the failpoint did not fire: {status} {reply}"}
        except (OSError, http.client.HTTPException):
            crashed = time.perf_counter()
    finally:
        server.stop()
    runs, last = 0, 0.0
    deadline = crashed + WAIT_S
    while time.perf_counter() < deadline:
        found = services.creation.lookup(workspace.id, "CRASH-1")
        if found is not None and found.outcome.value == "found_settled":
            return {
                "lease_s": 1.0,
                "crash_to_found_settled_s": round(time.perf_counter() - crashed, 2),
                "runtime_runs": runs,
                "last_runtime_once_s": round(last, 2),
            }
        started = time.perf_counter()
        subprocess.run(
            kandev("runtime", "--once"), env=env, capture_output=True,
            stdin=subprocess.DEVNULL, timeout=120, check=False,
        )
        runs, last = runs + 1, time.perf_counter() - started
        time.sleep(0.1)
    return {"error": "not settled within the bound", "runtime_runs": runs}
