"""Answers that carry a secret are never stored by a cache: a real `kandev-es
serve` sends `Cache-Control: no-store` on a created token, a Created with its
creation_handle, the handle's status, a run's create, errors and every other
API answer (one hook, api/app.py), but not on the auditor's page's static
stylesheet; `kandev-es mcp --http` sends it on a create tool's answer (its
creation_handle). Both backends."""

from __future__ import annotations

import uuid

import httpx

from kandev_es.agent.processes import stop_run
from tests.support.mcp_client import server_env
from tests.support.served import ServedMcp, ServedProcess, http


def test_secret_bearing_answers_of_serve_send_no_store(settings, tmp_path):
    server = ServedProcess(settings, tmp_path)
    run_id = ""
    try:
        base, admin, workspace = server.base, server.token, server.workspace_id
        token = http("POST", f"{base}/api/v1/tokens", admin, {"workspace_id": workspace})
        assert token.status == 201 and token.body["token"].startswith("kes_"), token.body
        created = http(
            "POST", f"{base}/api/v1/tasks", admin,
            {"workspace_id": workspace, "external_id": "NS-1", "title": "t", "start_agent": True},
        )
        assert created.status == 200 and "creation_handle" in created.body
        task_id = created.body["id"]
        from kandev_es.domain.agent_session import session_id_for

        run_id = str(session_id_for(uuid.UUID(task_id)))
        handle = created.body["creation_handle"]
        status = http("GET", f"{base}/api/v1/creations/{handle}", admin)
        refused = http("POST", f"{base}/api/v1/tasks", "kes_wrong", {"title": "t"})
        health = http("GET", f"{base}/healthz")
        for reply in (token, created, status, refused, health):
            assert reply.headers.get("Cache-Control") == "no-store", reply.headers
        css = http("GET", f"{base}/audit/static/audit.css")
        assert css.status == 200 and css.headers.get("Cache-Control") != "no-store"
    finally:
        if run_id:
            stop_run(run_id)
        server.stop()


def test_an_mcp_create_answer_sends_no_store(settings, services, workspace, member, tmp_path):
    with ServedMcp(settings, tmp_path, **server_env(settings)) as served:
        body = {
            "jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {
                "name": "create_task_kandev",
                "arguments": {"title": "over mcp", "external_id": "NS-2"},
            },
        }
        reply = httpx.post(served.url, json=body, timeout=20, headers={
            "Authorization": f"Bearer {member[1]}",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-06-18",
        })
        assert reply.status_code == 200, reply.text
        assert "creation_handle" in reply.text
        assert reply.headers["Cache-Control"] == "no-store"
        refused = httpx.post(served.url, json=body, timeout=20)
        assert refused.status_code == 401 and refused.headers["Cache-Control"] == "no-store"
