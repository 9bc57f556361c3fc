"""Fixtures shared by integration tests."""

from __future__ import annotations

import time
import uuid

import pytest

from kandev_es.agent.processes import stop_run
from kandev_es.bootstrap import bootstrap
from kandev_es.config import data_path
from kandev_es.domain.agent_session import session_id_for
from tests.integration.runs import Runs


@pytest.fixture
def paused_owner(settings, tmp_path):
    """A second server process-alike whose creations pause before their first
    effect step, until the test lets them go: a slow but live owner."""
    slow = bootstrap(settings.with_overrides(failpoint="policy:before@wait", lease_seconds=120))
    markers = data_path(slow.settings, "failpoints")

    def wait_until_paused() -> None:
        deadline = time.monotonic() + 30
        while not (markers / "policy_before.waiting").exists():
            assert time.monotonic() < deadline, "owner never reached the pause"
            time.sleep(0.02)

    def resume() -> None:
        markers.mkdir(parents=True, exist_ok=True)
        (markers / "policy_before.continue").touch()

    yield slow, wait_until_paused, resume
    resume()
    slow.close()


@pytest.fixture
def agents(monkeypatch):
    """Ids of tasks whose agents a test launched; each agent is stopped at the
    test's end, whatever happens."""
    monkeypatch.setenv("KANDEV_DEMO_AGENT_SECONDS", "120")
    launched: list[str] = []
    yield launched
    for task_id in launched:
        stop_run(str(session_id_for(uuid.UUID(task_id))))


@pytest.fixture
def runs(monkeypatch):
    """Agent runs launched by a test, stopped at its end whatever happens."""
    monkeypatch.setenv("KANDEV_DEMO_AGENT_SECONDS", "120")
    launched = Runs()
    yield launched
    launched.stop_all()


@pytest.fixture
def run(client, member, runs):
    return runs.launch(client, member[1])
