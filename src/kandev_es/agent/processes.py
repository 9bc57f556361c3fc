"""Finding agent processes in the world by their run id (Linux /proc), so an
unknown launch can be reconciled and a compensation proven."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

RUN_ID_VARIABLE = b"KANDEV_RUN_ID="


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _runs_by_pid() -> dict[int, set[bytes]]:
    """Each live pid whose environment carries KANDEV_RUN_ID, with its values."""
    found: dict[int, set[bytes]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        variables = environ.split(b"\x00")
        runs = {v[len(RUN_ID_VARIABLE) :] for v in variables if v.startswith(RUN_ID_VARIABLE)}
        if runs and _alive(int(entry.name)):
            found[int(entry.name)] = runs
    return found


def runs_as(pid: int, run_id: str) -> bool:
    """Whether ``pid`` is a live process of run ``run_id`` (a reused pid, or
    one of another run, is not)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return RUN_ID_VARIABLE + run_id.encode() in environ.split(b"\x00") and _alive(pid)


def await_exec(pid: int, run_id: str, seconds: float = 5.0) -> bool:
    """Wait until a process just started for run ``run_id`` shows it in /proc.
    Popen returns once the child's close-on-exec descriptors are closed, which
    the kernel does before it sets up the new program's environment: for a
    moment /proc/<pid>/environ is empty, and the new agent reads as no run's
    (its census, a compensation's stop_run and a reconcile would miss it).
    False if it exits first or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while not runs_as(pid, run_id):
        if not _alive(pid) or time.monotonic() >= deadline:
            return False
        time.sleep(0.001)
    return True


def processes_for_run(run_id: str) -> list[int]:
    """Live pids whose environment carries KANDEV_RUN_ID=<run_id>."""
    wanted = run_id.encode()
    return sorted(pid for pid, runs in _runs_by_pid().items() if wanted in runs)


def live_run_ids() -> set[str]:
    """The run id of every live agent process, in one pass over /proc."""
    return {run.decode(errors="replace") for runs in _runs_by_pid().values() for run in runs}


def stop_run(run_id: str, grace_seconds: float = 3.0) -> None:
    """SIGTERM every process of the run, then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = processes_for_run(run_id)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_seconds
        while time.monotonic() < deadline and processes_for_run(run_id):
            time.sleep(0.05)
