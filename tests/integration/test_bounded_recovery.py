"""One bad creation can neither loop nor block the others. A step whose
effect is made but never proven runs at most KANDEV_STEP_ATTEMPTS times, then
the creation is aborted and compensated (identity free, evidence recorded);
the Runtime takes a creation over at most KANDEV_RECOVERY_ATTEMPTS times, with
backoff, its last takeover aborting it (or parking it if even that cannot
finish); a failure while recovering one creation never stops the scan from
recovering the next. Real git, real dead owners (a process that SIGKILLs
itself), the real Runtime, both backends."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from kandev_es.bootstrap import bootstrap
from kandev_es.config import data_path
from kandev_es.creation.driver import event_bound
from kandev_es.domain.external_id import identity_id
from kandev_es.domain.identity import Identity
from kandev_es.domain.workspace import Workspace
from kandev_es.runtime.recovery import ABANDONED_REASON, backoff_seconds
from tests.conftest import bearer
from tests.integration.helpers import branches, crash_create, create, make_git_repository

LEASE = 1.0


@pytest.fixture
def runtime_services(settings):
    """Services whose Runtime takes over after a 1 s lease, without backoff."""
    services = bootstrap(settings.with_overrides(lease_seconds=LEASE, recovery_backoff_seconds=0))
    yield services
    services.close()


@pytest.fixture
def backend_repo(services, workspace, tmp_path):
    path = make_git_repository(tmp_path / "backend")
    services.repositories.register(workspace.id, "backend", str(path))
    return path


def store_poisoned_repository(services, workspace, name: str, path: Path) -> None:
    """A registration as an earlier version stored it, before names were
    matched in full: "inbox\\n" was accepted then."""
    stored = services.app.load(workspace.id, Workspace)
    stored.trigger_event(Workspace.RepositoryRegistered, name=name, path=str(path))
    services.app.save_atomically(stored)


def identity_events(services, key) -> list[str]:
    return [
        notification.topic.rsplit(".", 1)[-1]
        for notification in services.app.recorder.select_notifications(start=1, limit=1_000_000)
        if notification.originator_id == key
    ]


def lookup(client, workspace, secret, external_id):
    return client.get(
        f"/api/v1/workspaces/{workspace.id}/tasks/by-external-id",
        query_string={"external_id": external_id},
        headers=bearer(secret),
    )


def test_a_step_never_proven_is_aborted_within_the_bound_and_the_next_creation_recovers_in_the_same_scan(  # noqa: E501
    settings, client, services, runtime_services, workspace, member, backend_repo, tmp_path
):
    _, secret = member
    store_poisoned_repository(services, workspace, "inbox\n", make_git_repository(tmp_path / "in"))
    poisoned = {"external_id": "P-1", "title": "t", "repositories": ["inbox\n"]}
    queued = {"external_id": "Q-1", "title": "t", "repositories": ["backend"]}
    crash_create(settings, secret, poisoned, "claim:after")  # claimed first, owner dead
    crash_create(settings, secret, queued, "repository:before")  # (failpoints are one-shot)
    time.sleep(LEASE + 0.2)

    started = time.monotonic()
    recoveries = runtime_services.runtime().recover_once()
    elapsed = time.monotonic() - started

    assert [(r.identity_id, r.phase) for r in recoveries] == [
        (identity_id(workspace.id, "P-1"), "aborted"),
        (identity_id(workspace.id, "Q-1"), "completed"),
    ]
    assert elapsed < 60
    key = identity_id(workspace.id, "P-1")
    events = identity_events(services, key)
    bound = event_bound(1, settings.step_attempts, settings.recovery_attempts, resumes=0)
    assert len(events) <= bound
    assert events.count("StepRecorded") <= 3 * settings.step_attempts + 2
    identity = services.app.load(key, Identity)
    tenure = identity.tenure(1)
    assert tenure.phase == "aborted" and tenure.abort_reason == "effect_unproven"
    evidence = tenure.steps["repository:inbox\n"]["evidence"]
    assert tenure.steps["repository:inbox\n"]["status"] == "compensated"
    assert tenure.missing_proofs == settings.step_attempts - 1
    assert evidence == {"proof": "absent"}
    # The identity is free; the queued creation is settled, its branch made.
    assert lookup(client, workspace, secret, "P-1").status_code == 404
    assert create(client, secret, **queued).json["outcome"] == "found_settled"
    assert "kandev/KAN-2" in branches(backend_repo)
    # Nothing of the aborted creation is left in its repository.
    assert branches(tmp_path / "in") == ["main"]


def test_the_creating_request_itself_gives_up_on_a_step_never_proven(
    client, services, workspace, member, tmp_path
):
    _, secret = member
    store_poisoned_repository(services, workspace, "inbox\n", make_git_repository(tmp_path / "in"))
    answer = create(client, secret, external_id="P-2", title="t", repositories=["inbox\n"])
    assert answer.status_code == 502, answer.json
    assert answer.json["error"] == "effect_unproven"
    assert answer.json["details"]["attempts"] == services.settings.step_attempts
    assert lookup(client, workspace, secret, "P-2").status_code == 404
    key = identity_id(workspace.id, "P-2")
    failed = [e for e in identity_events(services, key) if e == "StepRecorded"]
    assert len(failed) <= 3 * services.settings.step_attempts + 2


def corrupt_worktree(settings, task_id) -> None:
    """The worktree stays listed by its repository, but git can no longer read
    it: every proof of the step raises."""
    worktree = data_path(settings, "worktrees", str(task_id), "backend")
    (worktree / ".git").write_text("gitdir: /nonexistent\n")
    probe = subprocess.run(["git", "-C", str(worktree), "rev-parse", "HEAD"], capture_output=True)
    assert probe.returncode != 0


def test_a_creation_whose_recovery_always_fails_neither_blocks_the_scan_nor_loops(
    settings, client, services, runtime_services, workspace, member, backend_repo, tmp_path, cli
):
    _, secret = member
    other = make_git_repository(tmp_path / "other")
    services.repositories.register(workspace.id, "other", str(other))
    broken = {"external_id": "B-1", "title": "t", "repositories": ["backend"]}
    queued = {"external_id": "Q-2", "title": "t", "repositories": ["other"]}
    crash_create(settings, secret, broken, "repository:after")  # made, never recorded
    key = identity_id(workspace.id, "B-1")
    corrupt_worktree(settings, services.app.load(key, Identity).tenure(1).task_id)
    crash_create(settings, secret, queued, "claim:after")
    time.sleep(LEASE + 0.2)
    runtime = runtime_services.runtime()

    # The first scan fails on B-1 and still recovers the creation behind it.
    [recovered] = runtime.recover_once()
    assert recovered.identity_id == identity_id(workspace.id, "Q-2")
    assert recovered.phase == "completed"

    attempts = settings.recovery_attempts
    for _ in range(attempts + 2):  # more scans than it may be taken over
        time.sleep(LEASE + 0.2)
        runtime.recover_once()
    identity = services.app.load(key, Identity)
    tenure = identity.tenure(1)
    events = identity_events(services, key)
    assert tenure.epoch == attempts
    assert events.count("RecoveryClaimed") == attempts
    assert len(events) <= event_bound(1, settings.step_attempts, attempts, resumes=0)
    # The last takeover gave it up (Aborting); its compensation cannot remove
    # the corrupted worktree either, so it is parked where operators see it.
    assert (tenure.phase, tenure.abort_reason) == ("aborting", ABANDONED_REASON)
    assert [(p.identity_id, p.phase, p.epoch) for p in runtime.parked()] == [
        (key, "aborting", attempts)
    ]
    listed = cli("runtime", "--parked")
    assert listed.exit_code == 0 and str(key) in listed.output
    assert "runtime: 1 creations parked" in listed.output
    time.sleep(LEASE + 0.2)
    assert runtime.recover_once() == []
    assert len(identity_events(services, key)) == len(events)  # it has stopped


def test_the_next_takeover_waits_for_its_backoff(
    settings, services, workspace, member, backend_repo
):
    _, secret = member
    body = {"external_id": "B-2", "title": "t", "repositories": ["backend"]}
    crash_create(settings, secret, body, "repository:after")
    key = identity_id(workspace.id, "B-2")
    corrupt_worktree(settings, services.app.load(key, Identity).tenure(1).task_id)
    slow = bootstrap(settings.with_overrides(lease_seconds=LEASE, recovery_backoff_seconds=60))
    try:
        runtime = slow.runtime()
        time.sleep(LEASE + 0.2)
        assert runtime.recover_once() == []  # taken over once, failed
        assert services.app.load(key, Identity).tenure(1).epoch == 1
        time.sleep(LEASE + 0.2)
        runtime.recover_once()  # lease over, backoff (60 s) not: left alone
        assert services.app.load(key, Identity).tenure(1).epoch == 1
    finally:
        slow.close()


def test_backoff_doubles_from_the_second_takeover_and_is_capped():
    assert [backoff_seconds(n, 5.0) for n in range(5)] == [0.0, 5.0, 10.0, 20.0, 40.0]
    assert backoff_seconds(10_000, 5.0) == 3600.0


def test_a_failing_recovery_scan_never_skips_revoking_exited_agents(
    settings, client, services, workspace, member, monkeypatch
):
    import threading
    import uuid

    from kandev_es.agent.processes import stop_run
    from kandev_es.domain.agent_session import session_id_for
    from tests.integration.test_runtime_agent_exit import revocations

    monkeypatch.setenv("KANDEV_DEMO_AGENT_SECONDS", "120")
    _, secret = member
    body = {"external_id": "AX-9", "title": "t", "start_agent": True}
    crash_create(settings, secret, body, "agent_launch:after")  # launched, owner dead
    task_id = uuid.UUID(create(client, secret, **body).json["id"])
    run_id = str(session_id_for(task_id))
    runtime = services.runtime()
    thread = threading.Thread(target=runtime.run_forever, args=(0.1,))
    try:
        stop_run(run_id)  # the agent exits
        with services.database.transaction() as tx:  # every recovery scan now fails
            tx.execute("DROP TABLE creations_view")
        thread.start()
        deadline = time.monotonic() + 30
        while revocations(services, run_id) != ["agent_exited"]:
            assert time.monotonic() < deadline, "the exited agent's credential stayed alive"
            time.sleep(0.1)
    finally:
        runtime.stop()
        thread.join(timeout=30)
        stop_run(run_id)


def test_one_run_that_cannot_be_revoked_never_keeps_the_others_credentials_alive(
    settings, client, services, workspace, member, monkeypatch
):
    import json
    import uuid

    from kandev_es.agent.processes import stop_run
    from kandev_es.domain.agent_session import session_id_for
    from tests.integration.test_runtime_agent_exit import revocations

    monkeypatch.setenv("KANDEV_DEMO_AGENT_SECONDS", "120")
    _, secret = member
    made = create(client, secret, external_id="AX-10", title="t", start_agent=True)
    assert made.status_code == 200, made.json
    run_id = str(session_id_for(uuid.UUID(made.json["id"])))
    # A pidfile no run credential can be derived from (sorted before the real one).
    bad = data_path(settings, "agents", f"{uuid.UUID(int=0)}.pid")
    bad.write_text(json.dumps({"run_id": "\ud800"}), encoding="utf-8")
    try:
        stop_run(run_id)
        services.runtime().revoke_exited_agents()
        assert revocations(services, run_id) == ["agent_exited"]
    finally:
        stop_run(run_id)
