"""Issue 42: a creation's owner renews its lease while a step works, so the
Runtime takes over only work whose owner is gone; an owner that lost its
lease makes no effect nobody removes; a takeover completes what another node
made. Real parts: the owner is a separate process (tests/support/
crashing_create.py) running one create against a real git repository whose
``post-checkout`` hook is slow; it is SIGKILLed, SIGSTOPped or paused at a
failpoint; the Runtime polls in a thread of this process, as ``serve`` runs it."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kandev_es.bootstrap import Services, bootstrap
from kandev_es.config import Settings, data_path
from kandev_es.domain.external_id import identity_id
from kandev_es.domain.identity import ABORTED, COMPLETED, Identity
from tests.integration.helpers import branches, make_git_repository, worktrees

LEASE = 1.0
POLL = 0.1


def slow_repository(path: Path, hook_seconds: float) -> tuple[Path, Path]:
    """A registered-to-be git repository whose ``post-checkout`` hook notes
    each checkout in a log and then sleeps ``hook_seconds``."""
    make_git_repository(path)
    checkouts = path.parent / f"{path.name}-checkouts.log"
    hook = path / ".git" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\necho \"$PWD\" >> '{checkouts}'\nsleep {hook_seconds}\n")
    hook.chmod(0o755)
    return path, checkouts


def checkouts(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


class Owner:
    """One create run by a process of its own (its own session), with the
    given settings; its stderr (the log) is kept."""

    def __init__(self, settings: Settings, secret: str, body: dict[str, Any], tmp: Path) -> None:
        raw = dataclasses.asdict(settings)
        raw["data_dir"] = str(raw["data_dir"])
        raw["repository_roots"] = [str(root) for root in raw["repository_roots"]]
        self.stderr = tmp / f"owner-{time.monotonic_ns()}.log"
        with self.stderr.open("wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.crashing_create", json.dumps(raw), secret,
                 json.dumps(body)],
                stdout=subprocess.PIPE, stderr=err, start_new_session=True,
            )

    def tree(self) -> list[int]:
        """The owner and every process under it (git and its hook: git runs in
        a process group of its own)."""
        found, queue = [], [self.process.pid]
        while queue:
            pid = queue.pop()
            found.append(pid)
            with contextlib.suppress(OSError):
                for task in Path(f"/proc/{pid}/task").iterdir():
                    queue += [int(c) for c in (task / "children").read_text().split()]
        return found

    def signal(self, number: int) -> None:
        for pid in self.tree():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, number)

    def finish(self, timeout: float) -> tuple[int, str, str]:
        out, _ = self.process.communicate(timeout=timeout)
        return self.process.returncode, out.decode(), self.stderr.read_text()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
            self.process.wait(timeout=10)


@contextlib.contextmanager
def runtime(settings: Settings, attempts: int = 5) -> Iterator[Services]:
    """A recovery Runtime scanning every POLL seconds in a thread, as a served
    worker runs it."""
    services = bootstrap(settings.with_overrides(
        lease_seconds=LEASE, recovery_backoff_seconds=0, recovery_attempts=attempts))
    scanner = services.runtime("runtime:test")
    thread = threading.Thread(target=scanner.run_forever, args=(POLL,), daemon=True)
    thread.start()
    try:
        yield services
    finally:
        scanner.stop()
        thread.join(timeout=30)
        services.close()


def events(services: Services, workspace: Any, external_id: str) -> list[Any]:
    return list(services.app.repository.event_store.get(identity_id(workspace.id, external_id)))


def kinds(found: list[Any]) -> list[str]:
    return [type(event).__name__ for event in found]


def wait_for(condition: Any, timeout: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"{what} not within {timeout} s"
        time.sleep(0.05)
    return time.monotonic() - started


def phase(services: Services, workspace: Any, external_id: str) -> str | None:
    identity = services.app.load(identity_id(workspace.id, external_id), Identity)
    return None if identity is None else identity.tenure(1).phase


@pytest.fixture
def owner_settings(settings: Settings) -> Settings:
    return settings.with_overrides(lease_seconds=LEASE)


def test_a_step_taking_three_leases_completes_once_without_a_takeover(
    services, owner_settings, workspace, member, tmp_path
):
    """The hook takes 3 leases; a Runtime scans all along. The owner renews
    (LeaseRenewed), the Runtime never takes over, one Completed, one worktree."""
    repo, log = slow_repository(tmp_path / "backend", 3 * LEASE)
    services.repositories.register(workspace.id, "backend", str(repo))
    body = {"external_id": "HB-1", "title": "t",
            "repositories": ["backend"]}
    with runtime(owner_settings):
        owner = Owner(owner_settings, member[1], body, tmp_path)
        try:
            code, out, err = owner.finish(timeout=60)
        finally:
            owner.kill()
    assert code == 0, err[-3000:]
    assert json.loads(out)["outcome"] == "created"
    found = kinds(events(services, workspace, "HB-1"))
    assert "RecoveryClaimed" not in found, found
    assert found.count("LeaseRenewed") >= 5, found  # every third of the 1 s lease for 3 s
    assert found.count("Completed") == 1 and found[-1] == "Completed", found
    assert checkouts(log) == 1
    assert branches(repo) == ["kandev/KAN-1", "main"] and len(worktrees(repo)) == 1


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGSTOP], ids=["sigkill", "sigstop"])
def test_an_owner_gone_mid_step_is_taken_over_within_about_a_lease(
    stop, services, owner_settings, workspace, member, tmp_path
):
    """The owner is in a 60 s hook (renewing) when it is SIGKILLed or
    SIGSTOPped with its git: the Runtime takes over within about a lease,
    finds the worktree and completes. A SIGCONTed owner then learns at its
    next renewal that it lost the lease, stops its git at once and answers
    that the creation was handed over; nothing is made twice."""
    repo, log = slow_repository(tmp_path / "backend", 60)
    services.repositories.register(workspace.id, "backend", str(repo))
    body = {"external_id": "HB-2", "title": "t",
            "repositories": ["backend"]}
    with runtime(owner_settings):
        owner = Owner(owner_settings, member[1], body, tmp_path)
        try:
            wait_for(lambda: checkouts(log) == 1, 30, "the hook")
            time.sleep(2 * LEASE)  # renewed meanwhile: still the owner's
            assert "RecoveryClaimed" not in kinds(events(services, workspace, "HB-2"))
            owner.signal(stop)
            taken = wait_for(lambda: "RecoveryClaimed" in kinds(
                events(services, workspace, "HB-2")), 10, "the takeover")
            wait_for(lambda: phase(services, workspace, "HB-2") == COMPLETED, 20, "completion")
            if stop == signal.SIGSTOP:
                owner.signal(signal.SIGCONT)
                resumed = time.monotonic()
                code, out, err = owner.finish(timeout=20)
                assert time.monotonic() - resumed < 5 * LEASE  # not the hook's 60 s
                assert code != 0 and "CreationHandedOver" in err, (code, out, err[-3000:])
        finally:
            owner.kill()
    # Within a lease of its last renewal, plus a scan or two on a busy machine.
    assert taken < 2 * LEASE + 1.0, taken
    found = kinds(events(services, workspace, "HB-2"))
    assert found.count("RecoveryClaimed") == 1 and found.count("Completed") == 1, found
    assert found[-1] == "Completed", found
    assert branches(repo) == ["kandev/KAN-1", "main"] and len(worktrees(repo)) == 1


@pytest.mark.parametrize("pause", ["repository:effect", "repository:fenced"])
def test_an_owner_that_lost_its_lease_leaves_no_effect_behind(
    pause, services, owner_settings, workspace, member, tmp_path
):
    """The owner is SIGSTOPped at a pause just before its step makes the
    branch and worktree, past its lease; the Runtime's one takeover aborts and
    compensates (nothing is there yet). Resumed, the owner either refuses to
    make the effect (``repository:effect``: its fence check renews and fails)
    or -- paused after that check (``repository:fenced``) -- makes it late and
    removes it itself. Either way nothing is left and the creation stays
    aborted, once."""
    repo, log = slow_repository(tmp_path / "backend", 0)
    services.repositories.register(workspace.id, "backend", str(repo))
    body = {"external_id": "HB-3", "title": "t",
            "repositories": ["backend"]}
    settings = owner_settings.with_overrides(failpoint=f"{pause}@wait")
    markers = data_path(settings, "failpoints")
    name = pause.replace(":", "_")
    with runtime(owner_settings, attempts=1):
        owner = Owner(settings, member[1], body, tmp_path)
        try:
            wait_for(lambda: (markers / f"{name}.waiting").exists(), 30, "the pause")
            owner.signal(signal.SIGSTOP)
            wait_for(lambda: phase(services, workspace, "HB-3") == ABORTED, 20, "the abort")
            (markers / f"{name}.continue").touch()
            owner.signal(signal.SIGCONT)
            code, out, err = owner.finish(timeout=30)
        finally:
            owner.kill()
    assert code != 0 and "CreationHandedOver" in err, (code, out, err[-3000:])
    found = kinds(events(services, workspace, "HB-3"))
    assert found.count("Aborted") == 1 and found[-1] == "Aborted", found
    assert branches(repo) == ["main"] and worktrees(repo) == []
    assert not (data_path(settings, "worktrees")).exists() or not any(
        data_path(settings, "worktrees").iterdir())
    marker = subprocess.run(["git", "-C", str(repo), "config", "--get-regexp", "kandevtask"],
                            capture_output=True, text=True)
    assert marker.stdout == ""
    # Made late and removed by the late owner, or never made at all.
    late = "finished after its lease was lost" in err
    assert (checkouts(log), late) == ((0, False) if pause == "repository:effect" else (1, True))


@pytest.mark.postgres_only  # SQLite's store is in the data dir: one data dir, one node
def test_a_runtime_on_another_node_completes_what_the_first_node_made(
    services, settings, workspace, member, tmp_path, agents
):
    """Node B's owner dies right after its repository step (its worktree under
    B's data dir); node A's Runtime, with a data dir of its own, recognises
    the branch's worktree, completes the creation instead of aborting, and
    starts the task's agent in that worktree."""
    repo, _ = slow_repository(tmp_path / "backend", 0)
    services.repositories.register(workspace.id, "backend", str(repo))
    body = {"external_id": "HB-4", "title": "t", "repositories": ["backend"],
            "start_agent": True}
    node_b = settings.with_overrides(data_dir=tmp_path / "node-b", lease_seconds=LEASE,
                                     failpoint="repository:after")
    owner = Owner(node_b, member[1], body, tmp_path)
    try:
        code, _, err = owner.finish(timeout=60)
    finally:
        owner.kill()
    assert code == -signal.SIGKILL, err[-3000:]
    [made] = worktrees(repo)
    assert Path(made).is_relative_to(tmp_path / "node-b")
    agents.append(Path(made).parent.name)  # the task id: its agent is stopped at the end
    with runtime(settings.with_overrides(data_dir=tmp_path / "node-a")):
        wait_for(lambda: phase(services, workspace, "HB-4") == COMPLETED, 30, "completion")
    found = events(services, workspace, "HB-4")
    assert "Aborting" not in kinds(found)
    succeeded = {e.step: e.evidence for e in found
                 if type(e).__name__ == "StepRecorded" and e.status == "succeeded"}
    assert succeeded["repository:backend"]["worktree"] == made
    assert succeeded["agent_launch"]["cwd"] == made
    assert branches(repo) == ["kandev/KAN-1", "main"] and worktrees(repo) == [made]


def test_a_release_while_a_renewed_step_runs_neither_stops_the_step_nor_is_lost(
    client, services, owner_settings, workspace, operator, tmp_path
):
    """An operator releases the identity while the owner's step runs and
    renews: the renewal that meets the Released re-reads (same epoch: still
    the owner's) and goes on renewing, the owner re-reads before recording
    its step instead of saving over the release, and the creation completes
    as created_identity_lost (AC-7), with no takeover."""
    from tests.integration.test_release import release

    _, secret = operator
    repo, log = slow_repository(tmp_path / "backend", 3 * LEASE)
    services.repositories.register(workspace.id, "backend", str(repo))
    body = {"external_id": "HB-5", "title": "t", "repositories": ["backend"]}
    owner = bootstrap(owner_settings)
    answer: dict[str, Any] = {}

    def create() -> None:
        principal = owner.tokens.authenticate(secret)
        answer["result"] = owner.creation.create(principal, body).to_response()

    thread = threading.Thread(target=create)
    try:
        with runtime(owner_settings):
            thread.start()
            wait_for(lambda: checkouts(log) == 1, 30, "the hook")
            wait_for(lambda: "LeaseRenewed" in kinds(events(services, workspace, "HB-5")),
                     10, "a renewal")
            released = release(client, workspace, secret, "HB-5", "op-hb-5")
            assert released.status_code == 200, released.json
            thread.join(timeout=30)
    finally:
        thread.join(timeout=30)
        owner.close()
    assert answer["result"]["outcome"] == "created_identity_lost", answer
    found = kinds(events(services, workspace, "HB-5"))
    assert "RecoveryClaimed" not in found and found[-1] == "Completed", found
    assert "LeaseRenewed" in found[found.index("Released"):], found  # renewed on after it
    assert branches(repo) == ["kandev/KAN-1", "main"] and len(worktrees(repo)) == 1


def test_renewals_are_fenced_by_the_stream_version_and_the_epoch(services, workspace, caplog):
    """Lease.renew on the real store: through the owner's own Identity while
    nobody else writes; after an operator's release (same epoch) on a fresh
    read, marking the owner's copy stale (it must be read again, not saved:
    it lacks the release); after a takeover, refused (LeaseLost, ``lost``)."""
    from kandev_es.creation.lease import Lease, LeaseLost
    from tests.integration.helpers import start_unsettled_creation
    from tests.integration.test_metrics_in_process import scrape_now, total

    before = scrape_now()
    start_unsettled_creation(services, workspace, "HB-6")
    key = identity_id(workspace.id, "HB-6")
    mine = services.app.load(key, Identity)
    assert mine is not None
    lease = Lease(services.app, key, 1, 0, 30.0)
    with lease.renewing(mine):  # the beat itself waits 10 s: only these renewals
        lease.renew()
        assert not lease.stale and mine.version == services.app.load(key, Identity).version
        other = services.app.load(key, Identity)
        other.release(1, "op-hb-6", "manual", actor="cli")
        services.app.save_atomically(other)
        lease.renew()
        assert lease.stale and not lease.lost.is_set()
    assert kinds(events(services, workspace, "HB-6"))[-3:] == [
        "LeaseRenewed", "Released", "LeaseRenewed"]
    taker = services.app.load(key, Identity)
    taker.recover(1, "runtime:other", datetime.now(UTC) + timedelta(seconds=30))
    services.app.save_atomically(taker)
    with caplog.at_level(logging.WARNING, logger="kandev_es"), pytest.raises(LeaseLost):
        lease.renew()
    assert lease.lost.is_set()
    lost_lines = [r for r in caplog.records if "lost its lease" in r.getMessage()]
    assert len(lost_lines) == 1  # logged once, as the metric counts it once
    assert kinds(events(services, workspace, "HB-6"))[-1] == "RecoveryClaimed"
    after, counter = scrape_now(), "kandev_creation_lease_renewals_total"
    assert [total(after, counter, result=r) - total(before, counter, result=r)
            for r in ("renewed", "lost")] == [2, 1]
