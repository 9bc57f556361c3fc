"""AC-TASKS-EXTERNAL-ID-001.5 / .8 under real crashes: the web worker serving a
create is SIGKILLed at every step boundary, for every step. Retries in the gap
answer found_unsettled; the Runtime then brings the creation to exactly one
end — Completed with exactly one branch, worktree, claim, reservation and at
most one agent process, or Aborted with none — and retries answer
found_settled (or a fresh Created after an abort)."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from kandev_es.agent.processes import processes_for_run, stop_run
from kandev_es.bootstrap import bootstrap
from kandev_es.domain.agent_session import session_id_for
from kandev_es.domain.wip import WipLedger, wip_ledger_id
from tests.integration.helpers import branches, make_git_repository, worktrees
from tests.support.served import ServedProcess, http, run_cli

LEASE = "1"  # seconds: the lease a killed owner leaves, waited out before the scan
BOUNDARIES = [
    "claim:after",
    *(
        f"{step}:{side}"
        for step in ("policy", "attachment", "repository", "agent_session", "agent_launch")
        for side in ("before", "after")
    ),
    "completing:before",
    "completing:after",
]


def recover(settings, boundary: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """One recovery scan, as `kandev-es runtime --once` makes it, and the phase
    of the one creation it settled. The first boundary runs the command itself
    (what an operator runs, its JSON line); the others run the same scan in this
    process (the Runtime over services of its own), which spares a process start
    and its imports per case: what is tried is where the crash left the creation."""
    if boundary == BOUNDARIES[0]:
        recovered = run_cli(
            settings, "runtime", "--once",
            KANDEV_LEASE_SECONDS=LEASE, KANDEV_DEMO_AGENT_SECONDS="120",
        )
        assert recovered.returncode == 0, recovered.stderr[-3000:]
        [line] = [json.loads(x) for x in recovered.stdout.splitlines() if x.startswith("{")]
        return str(line["phase"])
    monkeypatch.setenv("KANDEV_DEMO_AGENT_SECONDS", "120")  # what its agent inherits
    runner = bootstrap(settings.with_overrides(create_tables=False, lease_seconds=float(LEASE)))
    try:
        actor = runner.runtime()
        recoveries = actor.recover_once()
        actor.revoke_exited_agents()
    finally:
        runner.close()
    [recovery] = recoveries
    return str(recovery.phase)


def create(server: ServedProcess, body: dict) -> dict | None:
    try:
        reply = http("POST", server.base + "/api/v1/tasks", server.token, body)
    except OSError:  # the worker died mid-request: connection reset / closed
        return None
    return {"status": reply.status, **(reply.body or {})}


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_sigkill_at_step_boundary_settles_exactly_once(boundary, settings, tmp_path, monkeypatch):
    repo = make_git_repository(tmp_path / "repo")
    server = ServedProcess(
        settings,
        tmp_path,
        KANDEV_FAILPOINT=boundary,
        KANDEV_LEASE_SECONDS=LEASE,
        KANDEV_DEMO_AGENT_SECONDS="120",
        KANDEV_RUNTIME_IN_PROCESS="n",  # recovery here is the explicit `kandev-es runtime`
    )
    task_id = None
    try:
        ws, token = server.workspace_id, server.token
        assert (
            http(
                "POST",
                f"{server.base}/api/v1/workspaces/{ws}/repositories",
                token,
                {"name": "repo", "path": str(repo)},
            ).status
            == 201
        )
        attachment = http(
            "POST",
            f"{server.base}/api/v1/workspaces/{ws}/attachments?filename=spec.txt",
            token,
            raw=b"spec",
        ).body
        assert (
            http(
                "PUT", f"{server.base}/api/v1/workspaces/{ws}/policy", token, {"wip_limit": 3}
            ).status
            == 200
        )
        body = {
            "workspace_id": ws,
            "external_id": "CHAOS-1",
            "title": "crash me",
            "repositories": ["repo"],
            "attachments": [attachment["id"]],
            "start_agent": True,
        }

        assert create(server, body) is None, "the failpoint should have killed the worker"
        server.wait_healthy()  # gunicorn brought a fresh worker up
        during = create(server, body)
        assert during is not None and during["outcome"] == "found_unsettled", during
        assert during["creation_complete"] is False
        task_id = during["id"]

        time.sleep(float(LEASE) + 0.3)
        phase = recover(settings, boundary, monkeypatch)

        store = bootstrap(settings.with_overrides(create_tables=False))
        try:
            claim = store.attachments.get(uuid.UUID(ws), attachment["id"]).claimed_by
            ledger = store.app.load(wip_ledger_id(uuid.UUID(ws)), WipLedger)
        finally:
            store.close()
        agents = processes_for_run(str(session_id_for(uuid.UUID(task_id))))
        if phase == "completed":
            assert branches(repo) == ["kandev/KAN-1", "main"]
            [worktree] = worktrees(repo)
            assert Path(worktree).name == "repo"
            assert str(claim) == task_id
            assert ledger is not None and ledger.reserved == [task_id]
            assert len(agents) == 1
            after = create(server, body)
            assert after is not None and after["outcome"] == "found_settled"
            assert after["id"] == task_id
        else:
            assert phase == "aborted"
            assert branches(repo) == ["main"] and worktrees(repo) == []
            assert claim is None and (ledger is None or ledger.reserved == [])
            assert agents == []
            after = create(server, body)
            assert after is not None and after["outcome"] == "created"
    finally:
        server.stop()
        if task_id:
            stop_run(str(session_id_for(uuid.UUID(task_id))))


def test_serve_recovers_a_crashed_creation_by_itself(settings, tmp_path):
    server = ServedProcess(
        settings, tmp_path, KANDEV_FAILPOINT="repository:after", KANDEV_LEASE_SECONDS="1"
    )
    repo = make_git_repository(tmp_path / "repo")
    try:
        ws = server.workspace_id
        http(
            "POST",
            f"{server.base}/api/v1/workspaces/{ws}/repositories",
            server.token,
            {"name": "repo", "path": str(repo)},
        )
        body = {"workspace_id": ws, "external_id": "SELF-1", "title": "t", "repositories": ["repo"]}
        assert create(server, body) is None
        server.wait_healthy()
        deadline = time.monotonic() + 30
        answer = create(server, body)
        while answer is not None and answer["outcome"] != "found_settled":
            assert time.monotonic() < deadline, answer
            time.sleep(0.2)
            answer = create(server, body)
        assert answer is not None and answer["creation_complete"] is True
        assert branches(repo) == ["kandev/KAN-1", "main"] and len(worktrees(repo)) == 1
    finally:
        server.stop()
