"""docs/first-integration.md runs as written: its commands against a real
`kandev-es serve` (the store the server uses), its bridge (the page's code,
unchanged, as its own process) with the variables the page's environment block
names, its test deliveries and its lookups; each output is compared with the one
the page shows. Besides: the bridge listens on 127.0.0.1 only, an unsigned or
wrongly signed delivery creates nothing, and the auditor's history route refuses
the bridge's member token."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from kandev_es.config import Settings
from tests.e2e.test_docs_commands import SKIPPED, run_shown
from tests.support.pages import blocks
from tests.support.served import ServedProcess, free_port, http

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "first-integration.md"
BRIDGE = "<!-- bridge -->"
# Which token a `token create` line's output is, by the label the page gives it.
TOKENS_BY_LABEL = {"--label jira-bridge": "KANDEV_TOKEN", "--label auditor": "AUDITOR_TOKEN"}


def start_bridge(code: str, env: dict[str, str], workdir: Path) -> subprocess.Popen[bytes]:
    script = workdir / "bridge.py"
    script.write_text(code, encoding="utf-8")
    log = (workdir / "bridge.log").open("wb")
    bridge = subprocess.Popen([sys.executable, str(script)], env=env, cwd=workdir,
                              stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", int(env["BRIDGE_PORT"])), timeout=1).close()
            return bridge
        except OSError:
            assert bridge.poll() is None, (workdir / "bridge.log").read_text()
            assert time.monotonic() < deadline, "the bridge did not listen within 30 s"
            time.sleep(0.1)


def learn(command: str, output: str, env: dict[str, str]) -> None:
    """What a reader copies from an output into the bridge's environment."""
    answer = json.loads(output) if output.startswith("{") else {}
    if "task_prefix" in answer:
        env["KANDEV_WORKSPACE"] = answer["id"]
    for label, name in TOKENS_BY_LABEL.items():
        if label in command:
            env[name] = answer["token"]


def run_page(env: dict[str, str], workdir: Path) -> tuple[int, subprocess.Popen[bytes] | None]:
    found, ran, bridge = blocks(PAGE), 0, None
    for index, block in enumerate(found):
        if block.marker == BRIDGE:
            bridge = start_bridge(block.text, env, workdir)
            continue
        if block.language not in ("sh", "python") or block.marker.startswith(SKIPPED):
            continue
        where = f"docs/first-integration.md:{block.line}"
        stdout = run_shown(found, index, env, workdir, where, setup="")
        learn(block.text, stdout.strip(), env)
        ran += 1
    return ran, bridge


def test_the_first_integration_page_runs_as_written(tmp_path):
    settings = Settings(data_dir=tmp_path / "data")
    server = ServedProcess(settings, tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KANDEV_")}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        KANDEV_DATA_DIR=str(settings.data_dir),  # the CLI steps: the server's store
        KANDEV_URL=server.base,
        WEBHOOK_SECRET="a shared secret only Jira and the bridge know",
        BRIDGE_PORT=str(free_port()),
    )
    bridge = None
    try:
        ran, bridge = run_page(env, tmp_path)
        assert ran >= 6 and bridge is not None
        log = (tmp_path / "bridge.log").read_text()
        assert "created PAY-4711 KP-1" in log and "found_settled PAY-4711 KP-1" in log, log

        # Only 127.0.0.1 is listened on: another loopback address is refused.
        with socket.socket() as elsewhere:
            elsewhere.settimeout(2)
            assert elsewhere.connect_ex(("127.0.0.2", int(env["BRIDGE_PORT"]))) != 0

        # A delivery signed with another secret creates nothing either.
        body = json.dumps({"issue": {"key": "PAY-1", "fields": {"summary": "forged"}}})
        forged = http("POST", f"http://127.0.0.1:{env['BRIDGE_PORT']}/", raw=body.encode(),
                      headers={"X-Hub-Signature": "sha256=" + "0" * 64})
        assert forged.status == 401
        workspace = env["KANDEV_WORKSPACE"]
        lookup = f"{server.base}/api/v1/workspaces/{workspace}/tasks/by-external-id"
        assert http("GET", f"{lookup}?external_id=PAY-1", env["KANDEV_TOKEN"]).status == 404

        # The history route is the auditor's: the bridge's member token is refused.
        history = f"{server.base}/api/v1/workspaces/{workspace}/identities/history"
        refused = http("GET", f"{history}?external_id=PAY-4711", env["KANDEV_TOKEN"])
        assert refused.status == 403
    finally:
        if bridge is not None:
            bridge.terminate()
            bridge.wait(timeout=10)
        server.stop()
