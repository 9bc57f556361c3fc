"""The background work in a process of its own (docs/operations.md: What runs
where): `kandev-es serve --workers 2` starts exactly one `kandev-es background`
beside its web workers, which leads the projection loop, the ledger sequencer
and the webhook deliverer (the workers lead nothing); SIGKILLed, it is started
again and nothing is lost: events made before, during and after the kill are
sequenced (a signed checkpoint covers them) and delivered in feed order (a
duplicate only as the same webhook-id); SIGTERM of serve stops it cleanly.
`kandev-es background` alone beside workers that run none does the same work,
and two serve nodes on one PostgreSQL database keep one leader per role. Both
backends, real processes, a real webhook receiver on loopback."""

from __future__ import annotations

import os
import signal
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kandev_es.config import Settings
from tests.e2e.test_projection_leader import leading_workers, scraped_leaders
from tests.support.leader import role_holders
from tests.support.load import (
    background_pids,
    sigkill,
    wait_for_background,
    wait_for_workers,
)
from tests.support.receiver import Receiver
from tests.support.served import ConfServed, Launched, ServedProcess, free_port, http

WAIT_S = 60.0
HOOK_ENV = {
    "KANDEV_WEBHOOK_ALLOW_HTTP": "true",
    "KANDEV_WEBHOOK_ALLOW_NETWORKS": "127.0.0.0/8",
    "KANDEV_WEBHOOK_RETRY_SCHEDULE": "0.2,0.2,0.2,0.2,0.2",
}


def _wait_for(what: str, probe, seconds: float = WAIT_S):
    deadline = time.monotonic() + seconds
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: last saw {value!r}"
        time.sleep(0.1)


def _create(server: ServedProcess, external_id: str) -> None:
    made = http(
        "POST",
        f"{server.base}/api/v1/tasks",
        server.token,
        {"workspace_id": server.workspace_id, "external_id": external_id, "title": external_id},
    )
    assert made.status == 200, made.body


def _sequenced(server: ServedProcess, external_id: str) -> None:
    """Until a checkpoint the background process signed covers every event of
    the identity (its proof has an inclusion proof for each)."""
    query = urllib.parse.urlencode({"external_id": external_id, "proof": "1"})
    url = f"{server.base}/api/v1/workspaces/{server.workspace_id}/identities/history?{query}"

    def covered() -> bool:
        answer = http("GET", url, server.token)
        return answer.status == 200 and all(
            event["inclusion"] for event in answer.body["proof"]["events"]
        )

    _wait_for(f"{external_id} sequenced", covered)


def _feed_ids(server: ServedProcess) -> list[str]:
    page = http(
        "GET",
        f"{server.base}/api/v1/workspaces/{server.workspace_id}/events?after=0&limit=1000",
        server.token,
    )
    return [item["id"] for item in page.body["items"]]


def _subscribe(server: ServedProcess, url: str) -> None:
    made = http(
        "POST",
        f"{server.base}/api/v1/workspaces/{server.workspace_id}/webhooks",
        server.token,
        {"url": url, "event_types": ["task.created", "task.updated"]},
    )
    assert made.status == 201, made.body


def _leads_every_role(settings: Settings, pid: int) -> bool:
    return all(holders == [pid] for holders in role_holders(settings).values())


def _scrape(port: int) -> dict[str, float] | None:
    """The first sample of each family at 127.0.0.1:port/metrics (None: not yet listening)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    return {f.name: f.samples[0].value for f in text_string_to_metric_families(text) if f.samples}


def _first_seen(ids: list[str]) -> list[str]:
    return list(dict.fromkeys(ids))


@pytest.mark.timeout(240)
def test_serve_runs_one_background_process_and_starts_another_when_it_dies(
    settings: Settings, tmp_path: Path
):
    with (
        Receiver() as receiver,
        ServedProcess(settings, tmp_path / "logs", workers=2, **HOOK_ENV) as server,
    ):
        master = server.process.pid
        workers = wait_for_workers(master, 2)
        first = wait_for_background(master)
        assert len(workers) == 2 and first not in workers
        _wait_for(
            "the background process leads every role", lambda: _leads_every_role(settings, first)
        )
        _subscribe(server, receiver.url)
        for name in ("BG-A0", "BG-A1"):
            _create(server, name)
        _wait_for("the workers' gauges", lambda: leading_workers(settings, workers) == [])
        assert scraped_leaders(server) == 1  # the background process's, in the shared metrics
        _sequenced(server, "BG-A1")

        assert sigkill(first)
        for name in ("BG-B0", "BG-B1"):  # while it is down or starting again
            _create(server, name)
        second = wait_for_background(master, exclude=[first])
        assert wait_for_workers(master, 2) == workers  # the web workers never noticed
        _wait_for("the new background process leads", lambda: _leads_every_role(settings, second))
        _create(server, "BG-C0")
        for name in ("BG-A0", "BG-B0", "BG-B1", "BG-C0"):
            _sequenced(server, name)
        expected = _feed_ids(server)
        assert len(expected) == 5
        got = receiver.wait_for(lambda r: expected[-1] in [x.webhook_id for x in r], WAIT_S)
        ids = [r.webhook_id for r in got]
        # in feed order; the one in flight at the kill may come again, with its id
        assert _first_seen(ids) == expected, ids
        _wait_for("a scrape of one leader", lambda: scraped_leaders(server) == 1)

        os.kill(master, signal.SIGTERM)  # the master alone: it stops what it started
        server.process.wait(30)
        _wait_for("the background process gone", lambda: not Path(f"/proc/{second}").exists(), 15)
        assert f"background: pid {second} stopped" in server.output()
        assert server.output().count("background: started pid") == 2


@pytest.mark.timeout(240)
def test_background_alone_beside_web_workers_that_run_none(settings: Settings, tmp_path: Path):
    with ServedProcess(
        settings, tmp_path / "logs", workers=2, KANDEV_BACKGROUND="external"
    ) as server:
        workers = wait_for_workers(server.process.pid, 2)
        _create(server, "ALONE-0")
        time.sleep(1.5)  # a loop asks for its lead at once, then every second
        assert background_pids(server.process.pid) == []
        assert role_holders(settings) == {"projections": [], "ledger": [], "webhooks": []}
        assert leading_workers(settings, workers) == []
        port = free_port()
        args = ["background", "--metrics-port", str(port)]
        with Launched(args, settings, tmp_path / "background.log") as alone:
            pid = alone.process.pid
            _wait_for("the background process leads", lambda: _leads_every_role(settings, pid))
            # its own metrics (the server's scrape does not see a process apart)
            own = _wait_for("its metrics", lambda: _scrape(port))
            assert own["kandev_projection_leader"] == 1.0, own
            assert "kandev_projection_lag_events" in own
            assert scraped_leaders(server) == 0
            _create(server, "ALONE-1")
            _sequenced(server, "ALONE-0")
            _sequenced(server, "ALONE-1")
            alone.process.send_signal(signal.SIGTERM)
            assert alone.process.wait(30) == 0
            assert f"background: pid {pid} stopped" in alone.output()
        assert role_holders(settings) == {"projections": [], "ledger": [], "webhooks": []}


@pytest.mark.slow
@pytest.mark.postgres_only
@pytest.mark.timeout(240)
def test_two_serve_nodes_keep_one_leader_per_role(settings: Settings, tmp_path: Path):
    with (
        ServedProcess(settings, tmp_path / "logs-a", workers=1) as node_a,
        ServedProcess(settings, tmp_path / "logs-b", workers=1) as node_b,
    ):
        node_b.token, node_b.workspace_id = node_a.token, node_a.workspace_id
        backgrounds = [wait_for_background(n.process.pid) for n in (node_a, node_b)]

        def one_leader_each(candidates: list[int]) -> dict[str, int] | None:
            found = role_holders(settings)
            if all(len(pids) == 1 and pids[0] in candidates for pids in found.values()):
                return {role: pids[0] for role, pids in found.items()}
            return None

        leaders = _wait_for("one leader per role", lambda: one_leader_each(backgrounds))
        _create(node_a, "NODES-0")
        _sequenced(node_b, "NODES-0")
        # Kill the node whose background process leads the projections: the
        # other node's (or its own, started again) takes each role it held.
        killed = leaders["projections"]
        assert sigkill(killed)
        owner = node_a if killed == backgrounds[0] else node_b
        again = wait_for_background(owner.process.pid, exclude=[killed])
        survivors = [pid for pid in backgrounds if pid != killed] + [again]
        after = _wait_for("one leader per role again", lambda: one_leader_each(survivors))
        assert killed not in after.values()
        _create(node_b, "NODES-1")
        _sequenced(node_a, "NODES-1")


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.timeout(120)
def test_a_master_killed_with_sigkill_leaves_no_background_process(
    settings: Settings, tmp_path: Path
):
    """Its background process watches its parent: once the master is gone
    (SIGKILL: no on_exit), it stops by itself (logged), so no orphan keeps
    leading the roles a restarted server's own process must take."""
    with ServedProcess(settings, tmp_path / "logs") as server:
        master = server.process.pid
        orphan = wait_for_background(master)
        _wait_for("it leads", lambda: _leads_every_role(settings, orphan))
        os.kill(master, signal.SIGKILL)
        server.process.wait(10)
        _wait_for("the background process gone", lambda: not Path(f"/proc/{orphan}").exists(), 15)
        assert "is gone; stopping" in server.output()
        assert role_holders(settings) == {"projections": [], "ledger": [], "webhooks": []}


@pytest.mark.slow
@pytest.mark.postgres_only
@pytest.mark.timeout(180)
def test_the_production_command_starts_one_background_process_too(
    settings: Settings, tmp_path: Path
):
    """`gunicorn -c http/gunicorn.conf.py 'kandev_es.api:create_app()'` (two
    workers): the config's hooks start one background process, which leads
    every role while the workers lead none, and stop it with the master."""
    with ConfServed(settings, tmp_path / "logs") as server:
        master = server.process.pid
        workers = wait_for_workers(master, 2)
        background = wait_for_background(master)
        _wait_for("it leads", lambda: _leads_every_role(settings, background))
        _create(server, "CONF-0")
        _sequenced(server, "CONF-0")
        _wait_for("the workers' gauges", lambda: leading_workers(settings, workers) == [])
        os.kill(master, signal.SIGTERM)
        server.process.wait(30)
        _wait_for("it stopped", lambda: not Path(f"/proc/{background}").exists(), 15)
        assert f"background: pid {background} stopped" in server.output()
