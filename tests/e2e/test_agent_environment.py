"""What an agent sees: a real `kandev-es serve` started with a made-up secret,
the database URL and an operator allowlist launches a real agent that writes its
whole environment to a file; only the allowlisted names and the run's own
variables are there. Runs on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from pathlib import Path

from kandev_es.agent.processes import stop_run
from kandev_es.config import data_path
from tests.support.served import ServedProcess

WAIT_S = 60.0
SECRET = "s3cr3t-" + uuid.uuid4().hex


def test_an_agent_gets_only_the_allowlist_and_its_run_variables(settings, tmp_path):
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\nenv -0 > env.dump.tmp\nmv env.dump.tmp env.dump\n")
    server = ServedProcess(
        settings,
        tmp_path,
        KANDEV_AGENT_COMMAND=f"sh {script}",
        KANDEV_AGENT_ENV="ALLOWED_EXTRA, KANDEV_DATABASE_URL,KANDEV_SECRET_TOKEN",
        KANDEV_SECRET_TOKEN=SECRET,
        MADE_UP_SECRET=SECRET,
        ALLOWED_EXTRA="visible",
        LC_ALL="C",
    )
    run_id = ""
    try:
        task_id, run_id = server.start_agent_task("env probe")
        dump = data_path(settings, "sessions", task_id) / "env.dump"
        server.wait_for_file(dump, "agent never wrote env", WAIT_S)
        env = _parse(dump)
    finally:
        if run_id:
            stop_run(run_id)
        server.stop()
    assert SECRET not in dump.read_text(errors="replace")
    assert "MADE_UP_SECRET" not in env and "KANDEV_SECRET_TOKEN" not in env
    assert "KANDEV_DATABASE_URL" not in env and "KANDEV_DATA_DIR" not in env
    assert env["ALLOWED_EXTRA"] == "visible" and env["LC_ALL"] == "C"
    assert env["KANDEV_RUN_ID"] == run_id
    assert env["KANDEV_TASK_ID"] == task_id
    assert env["KANDEV_RUN_TOKEN"].startswith("kes_")
    kandev = {name for name in env if name.startswith("KANDEV_")}
    assert kandev == {
        "KANDEV_RUN_ID", "KANDEV_RUN_TOKEN", "KANDEV_TASK_ID", "KANDEV_API_URL", "KANDEV_WORKTREE",
    }
    # `env` itself may add PWD/SHLVL/_; nothing else from the server survives.
    assert set(env) - kandev - {"PWD", "SHLVL", "_", "OLDPWD"} <= {
        "PATH", "HOME", "LANG", "TZ", "ALLOWED_EXTRA", *(n for n in env if n.startswith("LC_")),
    }


def _parse(dump: Path) -> dict[str, str]:
    pairs = [item.split("=", 1) for item in dump.read_text().split("\0") if "=" in item]
    return {name: value for name, value in pairs}
