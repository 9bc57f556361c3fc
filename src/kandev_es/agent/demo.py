"""The bundled demo agent: a real process that writes a note into its worktree
and keeps running for a while, as a coding agent would."""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path


def main() -> int:
    task = os.environ.get("KANDEV_TASK_ID", "?")
    run_id = os.environ.get("KANDEV_RUN_ID", "?")
    seconds = float(os.environ.get("KANDEV_DEMO_AGENT_SECONDS", "30"))
    note = Path.cwd() / "KANDEV_AGENT.md"
    note.write_text(
        f"# kandev demo agent\n\ntask: {task}\nrun: {run_id}\n"
        f"started: {datetime.now(UTC).isoformat()}\n",
        encoding="utf-8",
    )
    print(f"demo agent for task {task} (run {run_id}) working in {Path.cwd()}", flush=True)
    time.sleep(seconds)
    print("demo agent done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
