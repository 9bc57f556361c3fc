"""Credentials on a real `kandev-es serve`, both backends: a run credential read
out of a real agent's environment works only with its run id on the run's own
task and ends when the agent exits; a member token is refused operator routes
with 403 operator_required, an operator token is not, and a token revoked by the
admin is refused on its next request."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid

from kandev_es.agent.processes import processes_for_run, stop_run
from kandev_es.config import data_path
from tests.support.served import ServedProcess, http

WAIT_S = 60.0


def _get(url: str, token: str, run_id: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"}
    if run_id:
        headers["X-Kandev-Run-Id"] = run_id
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=20):
            return 200
    except urllib.error.HTTPError as error:
        return error.code


def test_a_run_credential_works_only_for_its_run_and_ends_with_the_agent(settings, tmp_path):
    script = tmp_path / "agent.sh"
    # Dump the environment, then live until the test says "go".
    script.write_text(
        "#!/bin/sh\nenv -0 > env.tmp && mv env.tmp env.dump\n"
        "i=0; while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done\n"
    )
    server = ServedProcess(settings, tmp_path, KANDEV_AGENT_COMMAND=f"sh {script}")
    run_id = ""
    try:
        task_id, run_id = server.start_agent_task("run probe")
        session = data_path(settings, "sessions", task_id)
        server.wait_for_file(session / "env.dump", "the agent never wrote env.dump", WAIT_S)
        dumped = (session / "env.dump").read_text().split("\0")
        pairs = [item.split("=", 1) for item in dumped if "=" in item]
        run_token = dict(pairs)["KANDEV_RUN_TOKEN"]
        own_task = f"{server.base}/api/v1/tasks/{task_id}"

        assert _get(own_task, run_token, run_id) == 200, "the run reads its own task"
        assert _get(own_task, run_token) == 404, "without its run id it is no principal"
        assert _get(own_task, run_token, str(uuid.uuid4())) == 404, "another run id: nothing"
        listed = f"{server.base}/api/v1/workspaces/{server.workspace_id}/tasks"
        assert _get(listed, run_token, run_id) == 404, "not a run route"
        other = http(
            "POST", server.base + "/api/v1/tasks", run_token,
            {"workspace_id": server.workspace_id, "title": "smuggled"},
        )
        assert other.status == 404, other.body

        (session / "go").write_text("")
        deadline = time.monotonic() + WAIT_S
        while processes_for_run(run_id) or _get(own_task, run_token, run_id) != 404:
            assert time.monotonic() < deadline, f"credential outlived the agent:\n{server.log()}"
            time.sleep(0.2)
        assert _get(own_task, server.token) == 200, "the task itself is still there"
    finally:
        if run_id:
            stop_run(run_id)
        server.stop()


def test_roles_and_revocation_over_a_served_process(settings, tmp_path):
    server = ServedProcess(settings, tmp_path)
    try:
        base, workspace = server.base, server.workspace_id
        tokens = {}
        for role in ("member", "operator"):
            made = http("POST", base + "/api/v1/tokens", server.token,
                        {"workspace_id": workspace, "role": role, "label": f"e2e-{role}"})
            assert made.status in (200, 201), made.body
            assert made.body["role"] == role
            tokens[role] = made.body["token"]
        policy = f"{base}/api/v1/workspaces/{workspace}/policy"
        refused = http("PUT", policy, tokens["member"], {"wip_limit": 5})
        assert refused.status == 403 and refused.body["error"] == "operator_required", refused
        allowed = http("PUT", policy, tokens["operator"], {"wip_limit": 5})
        assert allowed.status == 200, allowed.body
        created = http("POST", base + "/api/v1/tasks", tokens["member"],
                       {"workspace_id": workspace, "title": "by a member", "external_id": "M-1"})
        assert created.status == 200 and created.body["outcome"] == "created", created.body

        listing = http("GET", base + "/api/v1/tokens", server.token)
        assert listing.status == 200, listing.body
        assert tokens["member"] not in json.dumps(listing.body), "no secret in the listing"
        entries = listing.body if isinstance(listing.body, list) else listing.body["tokens"]
        member_id = next(t["id"] for t in entries if t["label"] == "e2e-member")
        gone = http("DELETE", f"{base}/api/v1/tokens/{member_id}", server.token)
        assert gone.status == 204, gone.body
        after = http("GET", f"{base}/api/v1/tasks/{created.body['id']}", tokens["member"])
        assert after.status == 404, "a revoked token is refused on its next request"
        still = http("GET", f"{base}/api/v1/tasks/{created.body['id']}", tokens["operator"])
        assert still.status == 200
    finally:
        server.stop()
