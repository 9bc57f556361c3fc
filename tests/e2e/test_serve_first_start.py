"""`kandev-es serve` makes the `default` workspace and an admin token only on an
empty store, and never writes a secret into a JSON log stream (issue 46 point 2;
docs/operations.md: Production on PostgreSQL). The runbook's order — `db init`,
`workspace create payments`, `token create --admin`, then
`KANDEV_LOG_FORMAT=json kandev-es serve --workers 2` — makes no `default` and
prints no token; an empty store served with JSON logs gets its workspace and one
JSON line saying how to make a token, and no token. Real processes, both backends."""

from __future__ import annotations

import json
import time
from pathlib import Path

from kandev_es.config import Settings
from tests.support.served import Launched, free_port, http, run_cli

WAIT_S = 60.0


def cli(settings: Settings, *args: str) -> dict:
    done = run_cli(settings, *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def serve_json(settings: Settings, log_dir: Path) -> tuple[Launched, str]:
    """`serve --workers 2` with JSON logs, once it answers /healthz: the
    process and its base URL."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_dir.mkdir(parents=True, exist_ok=True)
    served = Launched(
        ["serve", "--host", "127.0.0.1", "--port", str(port), "--workers", "2"],
        settings,
        log_dir / f"serve-{port}.log",
        KANDEV_LOG_FORMAT="json",
        KANDEV_PUBLIC_URL=base,
    )
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        assert served.process.poll() is None, served.log()
        try:
            if http("GET", base + "/healthz", timeout=2).status == 200:
                return served, base
        except OSError:
            pass
        time.sleep(0.2)
    served.stop()
    raise AssertionError("serve did not answer:\n" + served.log())


def workspace_names(settings: Settings) -> list[str]:
    done = run_cli(settings, "workspace", "list", "--json")
    assert done.returncode == 0, done.stderr
    return [w["name"] for w in json.loads(done.stdout)]


def kandev_lines(output: str) -> list[dict]:
    """The process's own lines: JSON objects (gunicorn's lines keep its format)."""
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_the_postgres_runbook_gets_no_default_workspace_and_no_token_on_stderr(
    settings: Settings, tmp_path: Path
) -> None:
    initialised = run_cli(settings, "db", "init")
    assert initialised.returncode == 0, initialised.stderr
    payments = cli(settings, "workspace", "create", "payments")
    admin = cli(settings, "token", "create", "--admin")["token"]
    served, base = serve_json(settings, tmp_path / "logs")
    try:
        assert workspace_names(settings) == ["payments"]
        found = http("GET", f"{base}/api/v1/workspaces/{payments['id']}", admin)
        assert found.status == 200, found.body
        tokens = run_cli(settings, "token", "list")
        assert tokens.returncode == 0, tokens.stderr
        assert len(tokens.stdout.splitlines()) == 1, tokens.stdout  # only the runbook's
        output = served.output()
        assert "kes_" not in output and "admin token" not in output, output
        (howto,) = [line for line in kandev_lines(output) if "token create" in line["message"]]
        assert "kandev-es token create --admin" in howto["message"], howto
        assert "default" not in howto["message"], howto
    finally:
        served.stop()


def test_an_empty_store_served_with_json_logs_shows_no_token(
    settings: Settings, tmp_path: Path
) -> None:
    served, base = serve_json(settings, tmp_path / "logs")
    try:
        output = served.output()
        assert "kes_" not in output and "admin token" not in output, output
        (made,) = [line for line in kandev_lines(output) if "token create" in line["message"]]
        assert "created workspace default = " in made["message"], made
        tokens = run_cli(settings, "token", "list")
        assert tokens.returncode == 0 and tokens.stdout.strip() == "", tokens.stdout
        # The token the line says how to make works on the workspace it made.
        secret = cli(settings, "token", "create", "--admin")["token"]
        made_id = made["message"].split("workspace default = ")[1].split(";")[0]
        default = http("GET", f"{base}/api/v1/workspaces/{made_id}", secret)
        assert (default.status, default.body["name"]) == (200, "default"), default.body
    finally:
        served.stop()
    # A restart of that store (now not empty) makes nothing more and says so.
    again, _ = serve_json(settings, tmp_path / "logs-again")
    try:
        output = again.output()
        assert "kes_" not in output, output
        (line,) = [line for line in kandev_lines(output) if "token create" in line["message"]]
        assert "workspace default = " in line["message"] and "created" not in line["message"]
    finally:
        again.stop()
