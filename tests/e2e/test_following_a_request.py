"""Following one request through a real `kandev-es serve` with
KANDEV_LOG_FORMAT=json (docs/observability.md), both backends: the caller's
X-Request-Id comes back and is on the access line and on each line the
request wrote, with its route, status, duration and workspace; an agent's
agentctl create is followed the same way; the Python client's errors carry the
id. Every application line is one JSON object, and none of its fields holds a
secret the hostile suite uses: the admin and member tokens, a run credential,
an audit link and the database password (all sent where a careless log would
write them: headers, query strings, bodies)."""

from __future__ import annotations

import json
import re
import sys
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import pytest

from kandev_es.agent.processes import stop_run
from kandev_es.client import Client, ClientError
from kandev_es.domain.agent_session import session_id_for
from kandev_es.observability.logs import JSON_KEYS
from tests.support.served import ServedProcess, http, run_cli

DB_PASSWORD = "pw-SECRET-7a1c"
LINK_RE = re.compile(r"(https?://\S+audit_link=\S+)")
AGENT = """#!/bin/sh
echo "$KANDEV_RUN_TOKEN" > run-token
{python} -m kandev_es.cli agentctl task create --title "from the agent" --external-id AG-1 \\
  > agentctl.out.tmp 2>&1
mv agentctl.out.tmp agentctl.out
"""


def _with_password(settings: Any) -> Any:
    """The database URL with a password (the test cluster trusts local
    connections, so it is sent nowhere; a log that printed the URL would show it)."""
    url = settings.database_url
    if url is None:
        return settings
    parts = urllib.parse.urlsplit(url)
    netloc = f"{parts.username}:{DB_PASSWORD}@{parts.hostname}:{parts.port}"
    return settings.with_overrides(database_url=parts._replace(netloc=netloc).geturl())


def _json_lines(output: str) -> list[dict[str, Any]]:
    """The application's lines: every line that is not gunicorn's own or the
    first start's banner must be one JSON object."""
    lines = []
    for line in output.splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
        else:
            assert line.startswith(("[", "kandev-es:", "  curl")) or not line.strip(), line
    return lines


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return [value] if isinstance(value, str) else []


def _lines_once_logged(served: Any, request_id: str, seconds: float = 10.0) -> list[dict[str, Any]]:
    """The output's JSON lines once the access line of ``request_id`` (the last
    request) is among them: a worker writes it after the answer has gone out."""
    deadline = time.monotonic() + seconds
    while True:
        lines = _json_lines(served.output())
        if any(line["request_id"] == request_id and line["logger"] == "kandev_es.access"
               for line in lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


@pytest.fixture
def served(settings, tmp_path):
    script = tmp_path / "agent.sh"
    script.write_text(AGENT.format(python=sys.executable))
    server = ServedProcess(
        _with_password(settings), tmp_path / "logs",
        KANDEV_LOG_FORMAT="json", KANDEV_AGENT_COMMAND=f"/bin/sh {script}",
    )
    # JSON logs show no token (docs/observability.md): one made as the line says.
    assert server.token is None and "token create --admin" in server.output()
    issued = run_cli(_with_password(settings), "token", "create", "--admin")
    assert issued.returncode == 0, issued.stderr
    server.token = json.loads(issued.stdout)["token"]
    yield server
    server.stop()


def test_json_lines_follow_one_request_and_hold_no_secret(settings, served, tmp_path):
    base, ws, admin = served.base, served.workspace_id, served.token
    member = http("POST", base + "/api/v1/tokens", admin,
                  {"workspace_id": ws, "role": "member", "label": "json-logs"}).body["token"]
    created = http("POST", base + "/api/v1/tasks", member,
                   {"workspace_id": ws, "external_id": "J-1", "title": f"carries {member}",
                    "start_agent": True},
                   headers={"X-Request-Id": "follow-me-1"}, timeout=60)
    assert created.status == 200, created.body
    assert created.headers["X-Request-Id"] == "follow-me-1"
    session = Path(settings.data_dir) / "sessions" / created.body["id"]
    try:
        served.wait_for_file(session / "agentctl.out", "the agent's agentctl never answered")
    finally:
        stop_run(str(session_id_for(uuid.UUID(created.body["id"]))))
    outcome = json.loads((session / "agentctl.out").read_text().splitlines()[-1])
    assert outcome["outcome"] == "created", outcome
    run_token = (session / "run-token").read_text().strip()
    assert run_token.startswith("kes_")

    # Secrets where a careless log would write them: query strings, an audit link.
    for secret in (admin, run_token):
        http("GET", f"{base}/api/v1/tasks/{created.body['id']}?token={secret}", member)
    link = _audit_link(settings, served)
    assert http("GET", link).status == 200
    audit_secret = urllib.parse.parse_qs(urllib.parse.urlsplit(link).query)["audit_link"][0]
    secrets = [admin, member, run_token, DB_PASSWORD, audit_secret]

    # The Python client: an error names its request.
    with Client(base, member) as client, pytest.raises(ClientError) as refused:
        client.lookup(ws, "x" * 300)  # 400 invalid_external_id
    assert refused.value.status == 400 and refused.value.request_id

    lines = _lines_once_logged(served, refused.value.request_id)
    for line in lines:
        for secret in secrets:
            assert all(secret not in text for text in _strings(line)), (secret, line)
    mine = [line for line in lines if line["request_id"] == "follow-me-1"]
    access = [line for line in mine if line["logger"] == "kandev_es.access"]
    assert [(a["status"], a["route"], a["workspace"]) for a in access] == [
        (200, "/api/v1/tasks", ws)], mine
    assert access[0]["duration"] > 0 and list(access[0])[: len(JSON_KEYS)] == list(JSON_KEYS)
    assert any(line["message"].startswith("claimed ") for line in mine), mine
    agentctl = [line for line in lines if line["route"] == "/api/v1/agentctl/tasks"
                and line["logger"] == "kandev_es.access"]
    assert agentctl and agentctl[0]["status"] == 200 and agentctl[0]["request_id"]
    by_client = [line for line in lines if line["request_id"] == refused.value.request_id]
    assert [line["status"] for line in by_client if line["logger"] == "kandev_es.access"] == [400]


def _audit_link(settings: Any, served: ServedProcess) -> str:
    done = run_cli(_with_password(settings), "identity", "history", "--workspace",
                   served.workspace_id, "--external-id", "J-1", KANDEV_PUBLIC_URL=served.base)
    assert done.returncode == 0, done.stderr
    return LINK_RE.findall(done.stdout)[0]
