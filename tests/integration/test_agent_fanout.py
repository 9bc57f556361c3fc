"""Agents cannot start agents without bound: an agent run's create with
start_agent is admitted only while the run has fewer than
KANDEV_MAX_AGENTS_PER_RUN running agents of its own and the workspace fewer
than KANDEV_MAX_RUN_AGENTS_PER_WORKSPACE running agents started by runs. Over
either limit: 429 agent_limit_reached, nothing stored and no process started.
Counted from what is running, so an agent that exits frees its slot. Both
backends, real agent processes."""

from __future__ import annotations

import threading
import uuid

import pytest

from kandev_es.agent.census import running_launches
from kandev_es.agent.processes import live_run_ids, stop_run
from kandev_es.config import data_path
from kandev_es.domain.agent_session import session_id_for
from tests.integration.helpers import create
from tests.integration.runs import AGENTCTL

PER_RUN, PER_WORKSPACE = 2, 3


@pytest.fixture
def settings(settings):
    return settings.with_overrides(
        max_agents_per_run=PER_RUN, max_run_agents_per_workspace=PER_WORKSPACE
    )


@pytest.fixture
def children():
    """Agents started by agents in a test, stopped at its end."""
    started: list[str] = []
    yield started
    for run_id in started:
        stop_run(run_id)


def _start(client, run, children: list[str], **body):
    answer = client.post(
        AGENTCTL,
        json={"title": "child", "external_id": uuid.uuid4().hex, "start_agent": True, **body},
        headers=run.headers(),
    )
    if answer.status_code == 200:
        children.append(str(session_id_for(uuid.UUID(answer.json["id"]))))
    return answer


def _agents(services) -> list[str]:
    """The agents of this test's server running now (its data dir's launches;
    /proc holds other tests' agents too)."""
    return sorted(r.run_id for r in running_launches(data_path(services.settings, "agents")))


def _pidfiles(services) -> list[str]:
    return sorted(p.name for p in data_path(services.settings, "agents").glob("*.pid"))


def _refused_storing_nothing(client, services, run, children, scope: str) -> None:
    before, agents = services.app.max_notification_id(), _agents(services)
    pidfiles = _pidfiles(services)
    refused = _start(client, run, children)
    assert refused.status_code == 429, refused.json
    assert refused.json["error"] == "agent_limit_reached"
    assert refused.json["details"]["scope"] == scope
    assert services.app.max_notification_id() == before, "nothing stored"
    assert _agents(services) == agents, "no agent started"
    assert _pidfiles(services) == pidfiles, "no launch began"


def test_a_run_starts_agents_up_to_its_limit_and_an_exited_agent_frees_its_slot(
    client, services, member, runs, children
):
    run = runs.launch(client, member[1])
    for _ in range(PER_RUN):
        assert _start(client, run, children).status_code == 200
    assert set(children) <= live_run_ids()
    _refused_storing_nothing(client, services, run, children, "run")
    # The limit bounds agents, not tasks: a create without an agent still works.
    plain = client.post(AGENTCTL, json={"title": "no agent"}, headers=run.headers())
    assert plain.status_code == 200, plain.json
    stop_run(children[0])  # that agent exits: its slot is free again
    assert _start(client, run, children).status_code == 200


def test_runs_of_one_workspace_share_its_limit_and_members_are_not_bounded(
    client, services, member, runs, children
):
    first, second = runs.launch(client, member[1]), runs.launch(client, member[1], "second")
    for _ in range(PER_RUN):
        assert _start(client, first, children).status_code == 200
    assert _start(client, second, children).status_code == 200  # 3 = the workspace's limit
    _refused_storing_nothing(client, services, second, children, "workspace")
    # A member's own agent is no run-started agent.
    own = create(client, member[1], title="member agent", start_agent=True)
    assert own.status_code == 200, own.json
    runs.launched.append(str(session_id_for(uuid.UUID(own.json["id"]))))


def test_concurrent_creates_of_one_run_never_exceed_its_limit(
    services, settings, member, runs, children
):
    """All pass admission at once (nothing runs yet); the launch re-checks
    under the launch lock, so only PER_RUN agents start and the rest answer
    429 (their creations abort and compensate)."""
    from kandev_es.api import create_app

    app = create_app(services=services, run_projections=False)
    run = runs.launch(app.test_client(), member[1])
    answers: list[int] = []

    def one() -> None:
        answers.append(_start(app.test_client(), run, children).status_code)

    threads = [threading.Thread(target=one) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(answers) == [200] * PER_RUN + [429] * (6 - PER_RUN), answers
    assert len(set(children) & live_run_ids()) == PER_RUN
