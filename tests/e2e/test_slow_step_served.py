"""Issue 42, as an operator met it: `kandev-es serve` with a short lease
(KANDEV_LEASE_SECONDS=1) and two workers, its background process's Runtime
scanning every second,
and a repository whose ``post-checkout`` hook takes 3 leases. The create
answers Created; the identity's history holds lease renewals and no
takeover (before: ``RECOVERY by runtime:…`` while the hook ran, then
ABORTED); one branch and one worktree."""

from __future__ import annotations

import uuid
from pathlib import Path

from kandev_es.bootstrap import bootstrap
from kandev_es.domain.external_id import identity_id
from tests.integration.helpers import branches, make_git_repository, worktrees
from tests.support.served import ServedProcess, http

LEASE_S = 1.0
HOOK_S = 3 * LEASE_S


def test_a_served_create_whose_step_takes_three_leases_is_never_taken_over(settings, tmp_path):
    repo = make_git_repository(tmp_path / "slow")
    hook = repo / ".git" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\nsleep {HOOK_S}\n")
    hook.chmod(0o755)
    server = ServedProcess(settings, tmp_path, workers=2, KANDEV_LEASE_SECONDS=str(LEASE_S))
    try:
        ws, token = server.workspace_id, server.token
        registered = http("POST", f"{server.base}/api/v1/workspaces/{ws}/repositories", token,
                          {"name": "slow", "path": str(repo)})
        assert registered.status == 201, registered
        made = http("POST", server.base + "/api/v1/tasks", token,
                    {"workspace_id": ws, "external_id": "SLOW-1", "title": "t",
                     "repositories": ["slow"]})
        assert made.status == 200 and made.body["outcome"] == "created", made
    finally:
        server.stop()
    services = bootstrap(settings)
    try:
        events = list(services.app.repository.event_store.get(
            identity_id(uuid.UUID(ws), "SLOW-1")))
    finally:
        services.close()
    kinds = [type(event).__name__ for event in events]
    assert "RecoveryClaimed" not in kinds and "Aborting" not in kinds, kinds
    assert kinds.count("LeaseRenewed") >= 5 and kinds[-1] == "Completed", kinds
    [tree] = worktrees(repo)
    assert branches(repo) == [f"kandev/{made.body['identifier']}", "main"]
    assert Path(tree).name == "slow"
