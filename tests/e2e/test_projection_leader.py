"""One projection loop per database across real processes (docs/operations.md:
"One projection loop per database"): a `kandev-es serve --workers 2` whose
workers run the loop themselves (KANDEV_BACKGROUND=threads) has exactly one
leading worker, seen three ways — each worker's own `kandev_projection_leader`
value in the run's metrics directory, the scrape's sum, and the lock itself
(PostgreSQL: the advisory lock in pg_locks, held by the session named after the
worker; SQLite: the flock in /proc/locks). A SIGKILLed leader is replaced and
new creates still reach the feed; a `kandev-es projections run` process beside
a server is the one leader, and the server's background process takes over
when it dies. Both backends. (The default layout, one background process per
serve: tests/e2e/test_background_process.py.)"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from kandev_es.config import Settings, metrics_dir
from tests.support.leader import lock_holders
from tests.support.load import background_pids, sigkill, wait_for_background, wait_for_workers
from tests.support.served import Launched, ServedProcess, http, run_cli

WAIT_S = 30.0
GAUGE = "kandev_projection_leader"


def _wait_for(what: str, probe, seconds: float = WAIT_S):
    """Until ``probe()`` returns something true; that value."""
    deadline = time.monotonic() + seconds
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: last saw {value!r}"
        time.sleep(0.1)


def worker_leading(settings: Settings, pid: int) -> float | None:
    """One worker's own gauge (None before the worker made its instruments)."""
    files = [str(p) for p in metrics_dir(settings).glob(f"gauge_livesum_{pid}.db")]
    for metric in MultiProcessCollector.merge(files, accumulate=False):
        for sample in metric.samples:
            if sample.name == GAUGE:
                return sample.value
    return None


def scraped_leaders(server: ServedProcess) -> float:
    with urllib.request.urlopen(server.base + "/metrics", timeout=20) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == GAUGE:
                return sample.value
    raise AssertionError(f"{GAUGE} not scraped")


def create(server: ServedProcess, external_id: str) -> str:
    """A new task's id, retried while a worker restarts (a killed worker's
    connections fail)."""

    def attempt() -> str | None:
        try:
            reply = http(
                "POST", server.base + "/api/v1/tasks", server.token,
                {"workspace_id": server.workspace_id, "external_id": external_id,
                 "title": external_id},
            )
        except OSError:
            return None
        return str(reply.body["id"]) if reply.status == 200 else None

    return str(_wait_for(f"create {external_id}", attempt))


def projected(server: ServedProcess, task_id: str) -> None:
    """Until the task's task.created is in the workspace feed (a projection pass ran)."""

    def seen() -> bool:
        reply = http(
            "GET", f"{server.base}/api/v1/workspaces/{server.workspace_id}/events?limit=1000",
            server.token,
        )
        return reply.status == 200 and any(
            item["subject"] == task_id and item["type"] == "task.created"
            for item in reply.body["items"]
        )

    _wait_for(f"task {task_id} in the feed", seen)


def leading_workers(settings: Settings, workers: list[int]) -> list[int] | None:
    """The workers whose own gauge says they lead, once every worker has one."""
    values = {pid: worker_leading(settings, pid) for pid in workers}
    if None in values.values():
        return None
    return [pid for pid, value in values.items() if value]


def test_two_workers_have_one_leader_and_a_killed_leader_is_replaced(
    settings: Settings, tmp_path: Path
):
    with ServedProcess(settings, tmp_path, workers=2, KANDEV_BACKGROUND="threads") as server:
        assert background_pids(server.process.pid) == []
        workers = wait_for_workers(server.process.pid, 2)
        # Every worker made its instruments, then started its loop; once a create
        # has been projected, every loop has asked for the lead at least once.
        _wait_for("both workers' gauges", lambda: leading_workers(settings, workers) is not None)
        projected(server, create(server, "LEAD-1"))
        leaders = _wait_for("a leading worker", lambda: leading_workers(settings, workers))
        assert len(leaders) == 1, leaders
        (leader,) = leaders
        assert lock_holders(settings) == [leader]
        assert scraped_leaders(server) == 1

        assert sigkill(leader)
        task = create(server, "LEAD-2")
        projected(server, task)  # a surviving or a respawned worker took over
        survivors = wait_for_workers(server.process.pid, 2, exclude=[leader])
        holders = _wait_for("a new lock holder", lambda: lock_holders(settings))
        assert len(holders) == 1 and holders[0] in survivors, (holders, survivors)
        assert _wait_for(
            "one leader again", lambda: leading_workers(settings, survivors) == holders
        )
        # The killed worker's gauge leaves the sum once the master has reaped it.
        assert _wait_for("a scrape of one leader", lambda: scraped_leaders(server) == 1)


def test_a_projections_run_process_beside_a_server_is_the_one_leader(
    settings: Settings, tmp_path: Path
):
    done = run_cli(settings, "db", "init")
    assert done.returncode == 0, done.stderr
    with Launched(["projections", "run"], settings, tmp_path / "projections-run.log") as run:
        loop = run.process
        _wait_for("the projections process leads", lambda: lock_holders(settings) == [loop.pid])
        with ServedProcess(settings, tmp_path, workers=2) as server:
            workers = wait_for_workers(server.process.pid, 2)
            _wait_for("both gauges", lambda: leading_workers(settings, workers) is not None)
            background = wait_for_background(server.process.pid)
            projected(server, create(server, "BESIDE-1"))  # by the projections process
            assert leading_workers(settings, workers) == []
            assert scraped_leaders(server) == 0
            assert lock_holders(settings) == [loop.pid]

            assert sigkill(loop.pid)
            loop.wait(10)
            projected(server, create(server, "BESIDE-2"))
            holders = _wait_for("the server leads", lambda: lock_holders(settings))
            assert holders == [background], (holders, workers)
            assert _wait_for("one leader in the server", lambda: scraped_leaders(server) == 1)
            assert leading_workers(settings, workers) == []
