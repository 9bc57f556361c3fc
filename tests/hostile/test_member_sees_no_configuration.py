"""Members see no server configuration, over a real `kandev-es serve`, both
backends: a member that created a task with a real agent (started from an agent
command with an argument of its own) on a registered git repository reads its
create answer and ``/api/v1/creations/<handle>``, is refused the identity
history route, and opens the auditor's page with an audit link printed by
`kandev-es identity history`: none of it holds the test's paths (data dir,
worktrees, logs, the repository), the agent command's arguments or the agent's
pid. An operator token reads all of them from the same served process.
(The in-process version is tests/integration/test_disclosure.py.)"""

from __future__ import annotations

import json
import re
import shlex
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

from kandev_es.agent.processes import stop_run
from kandev_es.domain.agent_session import session_id_for
from kandev_es.services.audit_links import LINK_PARAMETER
from tests.integration.helpers import make_git_repository
from tests.support.served import ServedProcess, http, run_cli

FLAG = "--disclosure-probe-flag"
LINK_RE = re.compile(r"(https?://\S+)")


def _token(server: ServedProcess, role: str) -> str:
    made = http("POST", server.base + "/api/v1/tokens", server.token,
                {"workspace_id": server.workspace_id, "role": role, "label": f"hostile-{role}"})
    assert made.status in (200, 201), made.body
    return str(made.body["token"])


def _configuration(server_settings_dir: Path, tmp_path: Path, command: str) -> list[str]:
    """What a member must never read: every path under the test's root (data
    dir, worktrees, logs, the registered repository) and each argument of the
    agent command."""
    return [str(tmp_path), str(server_settings_dir), *shlex.split(command)]


def _assert_none_in(text: str, secrets: list[str], where: str) -> None:
    for value in secrets:
        assert value not in text, f"{where} shows {value!r}"


def _audit_link(settings: Any, server: ServedProcess, external_id: str) -> str:
    printed = run_cli(settings, "identity", "history", "--workspace", server.workspace_id,
                      "--external-id", external_id, KANDEV_PUBLIC_URL=server.base)
    assert printed.returncode == 0, printed.stderr
    [url] = [u for u in LINK_RE.findall(printed.stdout) if f"{LINK_PARAMETER}=" in u]
    assert url.startswith(server.base + "/audit/identities?"), url
    return url


def test_a_member_reads_its_creation_history_and_audit_page_without_configuration(
    settings, tmp_path
):
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\nsleep 120\n")
    command = f"/bin/sh {script} {FLAG}"
    server = ServedProcess(settings, tmp_path / "logs", KANDEV_AGENT_COMMAND=command)
    run_id = ""
    try:
        base, ws = server.base, server.workspace_id
        member, operator = _token(server, "member"), _token(server, "operator")
        repo = make_git_repository(tmp_path / "backend")
        registered = http("POST", f"{base}/api/v1/workspaces/{ws}/repositories", operator,
                          {"name": "backend", "path": str(repo)})
        assert registered.status == 201, registered.body

        created = http("POST", base + "/api/v1/tasks", member,
                       {"workspace_id": ws, "external_id": "D-1", "title": "t",
                        "repositories": ["backend"], "start_agent": True}, timeout=60)
        assert created.status == 200, created.body
        run_id = str(session_id_for(uuid.UUID(created.body["id"])))

        # The operator reads the full stored evidence: the command, the data dir, the pid.
        query = urllib.parse.urlencode({"external_id": "D-1"})
        full = http("GET", f"{base}/api/v1/workspaces/{ws}/identities/history?{query}", operator)
        assert full.status == 200, full.body
        [launch] = [e["evidence"] for e in full.body["events"]
                    if e["event"] == "StepRecorded" and e["step"] == "agent_launch"
                    and e["evidence"]]
        assert launch["command"] == shlex.split(command)
        assert str(settings.data_dir) in launch["log"]
        pid = str(launch["pid"])
        assert pid.isdigit() and launch["run_id"] == run_id
        secrets = _configuration(settings.data_dir, tmp_path, command)

        # The member: its create answer and its creation's steps.
        _assert_none_in(json.dumps(created.body), secrets, "the create answer")
        handle = created.body["creation_handle"]
        status = http("GET", f"{base}/api/v1/creations/{handle}", member)
        assert status.status == 200, status.body
        _assert_none_in(json.dumps(status.body), secrets, "the creation status")
        steps = {step["name"]: step for step in status.body["steps"]}
        assert steps["agent_launch"]["status"] == "succeeded"
        assert steps["agent_launch"]["evidence"] == {"run_id": run_id}
        assert pid not in json.dumps(steps["agent_launch"])
        assert "worktree" not in steps["repository:backend"]["evidence"]
        assert '"pid"' not in json.dumps(status.body)

        # The identity history route refuses a member, and says nothing.
        refused = http("GET", f"{base}/api/v1/workspaces/{ws}/identities/history?{query}",
                       member)
        assert (refused.status, refused.body["error"]) == (403, "operator_required"), refused
        _assert_none_in(json.dumps(refused.body), secrets, "the refusal")

        # The auditor's page by audit link: the steps, no configuration, no pid.
        url = _audit_link(settings, server, "D-1")
        by_link = http("GET", url)
        assert by_link.status == 200, by_link.body
        html = str(by_link.body)
        assert "agent_launch" in html and run_id in html
        _assert_none_in(html, secrets, "the page by audit link")
        assert f">{pid}<" not in html and f":{pid}" not in html, "the page shows the pid"

        # The same page with an operator token shows them.
        page = http("GET", f"{base}/audit/identities?"
                    + urllib.parse.urlencode({"workspace": ws, "external_id": "D-1"}), operator)
        assert page.status == 200, page.body
        assert str(settings.data_dir) in str(page.body) and f">{pid}<" in str(page.body)
    finally:
        if run_id:
            stop_run(run_id)
        server.stop()
