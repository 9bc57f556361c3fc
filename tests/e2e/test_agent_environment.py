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


DEFAULT_URL = "http://127.0.0.1:8000"  # KANDEV_PUBLIC_URL's default: not where these listen


def _agent_api_url(server, settings) -> str:
    """The KANDEV_API_URL a real agent launched by ``server`` got."""
    run_id = ""
    try:
        task_id, run_id = server.start_agent_task("url probe")
        dump = data_path(settings, "sessions", task_id) / "env.dump"
        server.wait_for_file(dump, "agent never wrote env", WAIT_S)
        return _parse(dump)["KANDEV_API_URL"]
    finally:
        if run_id:
            stop_run(run_id)


def test_agents_get_the_address_serve_listens_on_not_the_public_url(settings, tmp_path):
    """`serve --port P` (not 8000), KANDEV_PUBLIC_URL left at its default: the
    agent's KANDEV_API_URL is where the server listens, and answers there."""
    from tests.support.served import http

    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\nenv -0 > env.dump.tmp\nmv env.dump.tmp env.dump\n")
    server = ServedProcess(
        settings, tmp_path, KANDEV_AGENT_COMMAND=f"sh {script}", KANDEV_PUBLIC_URL=DEFAULT_URL
    )
    try:
        assert server.port != 8000
        url = _agent_api_url(server, settings)
        assert url == server.base
        assert http("GET", f"{url}/healthz").status == 200
    finally:
        server.stop()


def test_agents_get_the_production_commands_bind(settings, tmp_path):
    """The production command (gunicorn -c http/gunicorn.conf.py) on KANDEV_BIND."""
    from tests.support.served import ConfServed

    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\nenv -0 > env.dump.tmp\nmv env.dump.tmp env.dump\n")
    server = ConfServed(
        settings, tmp_path, KANDEV_AGENT_COMMAND=f"sh {script}", KANDEV_PUBLIC_URL=DEFAULT_URL,
        KANDEV_WORKERS="1",
    )
    try:
        assert _agent_api_url(server, settings) == server.base
    finally:
        server.stop()
