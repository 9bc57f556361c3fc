"""A plain ``pip install -e .`` has no psycopg (it is the ``postgres`` extra):
the SQLite path must never import it. Each test runs in a subprocess whose
import system refuses psycopg and psycopg_pool, as on a fresh machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kandev_es.config import Settings
from tests.support import without_psycopg
from tests.support.served import ServedProcess, environment, http

LAUNCHER = [sys.executable, without_psycopg.__file__]

APP_FACTORY = """
import sys
try:
    import psycopg_pool
except ImportError:
    pass
else:
    raise SystemExit("the blocker let psycopg_pool through")

from kandev_es.api import create_app
from kandev_es.bootstrap import bootstrap
from kandev_es.config import load_settings

settings = load_settings()
services = bootstrap(settings)
workspace, _ = services.workspaces.ensure("default")
secret, _ = services.tokens.issue(workspace_id=None, admin=True, label="test")
services.close()
app = create_app(settings)
reply = app.test_client().post(
    "/api/v1/tasks",
    headers={"Authorization": f"Bearer {secret}"},
    json={"workspace_id": str(workspace.id), "external_id": "JIRA-1", "title": "First task"},
)
loaded = sorted(m for m in sys.modules if m.split(".")[0].startswith("psycopg"))
print(reply.status_code, reply.get_json()["outcome"], loaded)
"""


def test_app_factory_creates_a_task_without_psycopg(tmp_path: Path):
    settings = Settings(data_dir=tmp_path / "data")
    result = subprocess.run(
        [*LAUNCHER, "-c", APP_FACTORY],
        env=environment(settings, KANDEV_RUNTIME_IN_PROCESS="0"),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "200 created []"


def test_serve_creates_a_task_without_psycopg(tmp_path: Path):
    served = ServedProcess(Settings(data_dir=tmp_path / "data"), tmp_path, launcher=LAUNCHER)
    try:
        reply = http(
            "POST",
            served.base + "/api/v1/tasks",
            served.token,
            {"workspace_id": served.workspace_id, "external_id": "JIRA-1", "title": "First task"},
        )
        assert (reply.status, reply.body["outcome"]) == (200, "created"), served.log()
        assert "psycopg" not in served.log()
    finally:
        served.stop()
