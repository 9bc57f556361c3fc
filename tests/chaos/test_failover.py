"""Losing the database primary under a create load (docs/operations.md
"High availability"), with real parts only: a pg_auto_failover formation on
127.0.0.1 (``scripts/ha-cluster``: a monitor, a primary and a synchronous
standby), two ``kandev-es serve`` nodes with their own data dirs on the
formation's one multi-host URL, and client threads creating tasks over HTTP
with fresh external IDs and retries of IDs already sent; one client's
creates have a real effect (a branch and a worktree in a registered git
repository).

During the load the primary dies (SIGKILL of its postmaster and its
pg_autoctl keeper: an unplanned failover), the old primary rejoins as the
standby, and then a planned failover moves the primary back. Afterwards: no
500 and no hang (every answer a success or a typed 503 with Retry-After);
the load goes less than 30 s without a Created around each failover, and a
fresh create through ``kandev_es.client`` (it retries 503s) succeeds right
after each; every Created ever acknowledged is still there, held by the same
task; one task per external ID; the feed holds exactly one ``task.created``
per task; ``audit verify`` is clean; /readyz reported a synchronous standby
before and ``db init`` says so. Before anything catches the read models up
explicitly, every node's feed shows every acknowledged task within 30 s of
the load's end (the projection leader's lock moved and its LISTEN reconnected
across the failovers); and the git repository holds exactly one branch and
one worktree per task that asked for it, none for an aborted creation.

PostgreSQL only; skipped when the formation cannot start (no pg_autoctl and
not root to install it). The short form runs in the suite (about 2 minutes);
``scripts/failover-under-load`` runs the long form and prints its figures."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kandev_es.projections.leadership import lock_key

from kandev_es.client import Client, Outcome
from kandev_es.config import Settings
from tests.chaos.test_faults_under_load import (
    assert_answers_are_typed,
    assert_nothing_lost_or_doubled,
    inspect,
    record,
    report,
)
from tests.integration.helpers import branches, make_git_repository, worktrees
from tests.support.load import TYPED_503, CreateLoad, call, summary
from tests.support.served import ROOT, ServedProcess, http, run_cli

pytest.importorskip("psycopg")

HA_CLUSTER = ROOT / "scripts" / "ha-cluster"
LONG = os.environ.get("KANDEV_LONG_FAILOVER") == "1"
LEASE_S = 2.0
WORKERS = 2
CLIENT_TIMEOUT_S = 20.0
# Creates succeed again within this long after each failover (the bound).
BACK_WITHIN_S = 30.0
# The feeds show every acknowledged task this long after the load, by themselves.
PROJECTED_WITHIN_S = 30.0


@dataclass(frozen=True)
class Profile:
    clients: int  # per API node
    warmup_s: float
    between_s: float  # load between the rejoin and the planned failover
    after_s: float
    rounds: int  # unplanned + planned failover pairs


SHORT = Profile(clients=3, warmup_s=2.0, between_s=2.0, after_s=2.0, rounds=1)
LONG_PROFILE = Profile(clients=6, warmup_s=5.0, between_s=5.0, after_s=5.0, rounds=3)


def ha(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(HA_CLUSTER), *args], capture_output=True,
                          text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def formation() -> Iterator[tuple[Path, str]]:
    # Not under pytest's tmp dir: its parent is reset to 0700 by concurrent runs.
    directory = Path(tempfile.mkdtemp(prefix="kandev-es-ha-"))
    started = ha("start", "--dir", str(directory))
    try:
        if started.returncode != 0:
            pytest.skip(f"no pg_auto_failover formation here: {started.stderr.strip()[-500:]}")
        yield directory, started.stdout.strip()
    finally:
        ha("stop", "--dir", str(directory), timeout=120)
        shutil.rmtree(directory, ignore_errors=True)


def failover(directory: Path, unplanned: bool) -> float:
    args = ["failover", "--dir", str(directory)] + (["--unplanned"] if unplanned else [])
    done = ha(*args, timeout=180)
    assert done.returncode == 0, done.stderr
    return float(done.stdout.strip())


def rejoin(directory: Path) -> None:
    done = ha("rejoin", "--dir", str(directory), timeout=240)
    assert done.returncode == 0, done.stderr


def created_again(base: str, token: str, workspace: str, since: float) -> float:
    """Seconds from ``since`` until a fresh create through the client library
    (which retries 503s as Retry-After says, for at most 30 s) answers Created."""
    with Client(base, token, timeout=CLIENT_TIMEOUT_S, deadline=BACK_WITHIN_S) as client:
        made = client.create_task(workspace, "after failover", external_id=f"AF-{uuid.uuid4()}")
    assert made.outcome == Outcome.CREATED
    return time.monotonic() - since


def seconds_without_created(loads: list[CreateLoad], start: float, end: float) -> float:
    """The longest stretch inside [start, end] in which the load got no Created
    answered: a failover's time without service, as the clients saw it."""
    done = sorted(a.ended for load in loads for a in load.snapshot() if a.acknowledged_created)
    before = [t for t in done if t < start]
    inside = [t for t in done if start <= t <= end]
    marks = [before[-1] if before else start, *inside, end]
    return max(b - a for a, b in itertools.pairwise(marks))


def feeds_catch_up_by_themselves(reads: list[tuple[str, CreateLoad]], token: str) -> float:
    """Seconds until each workspace's feed, read over HTTP through ``base``,
    holds a ``task.created`` for every Created its load got acknowledged, with
    nothing catching the read models up but the nodes' own projection loops."""
    started = time.monotonic()
    cursors = {load.workspaces[0]: 0 for _, load in reads}
    seen: dict[str, set[str]] = {workspace: set() for workspace in cursors}
    while True:
        missing = 0
        for base, load in reads:
            workspace = load.workspaces[0]
            more = True
            while more:
                url = (f"{base}/api/v1/workspaces/{workspace}/events"
                       f"?after={cursors[workspace]}&limit=1000")
                status, page, _, failure = call("GET", url, token, timeout=CLIENT_TIMEOUT_S)
                assert status == 200, (status, page, failure)
                seen[workspace].update(str(item["data"]["id"]) for item in page["items"]
                                       if item["type"] == "task.created")
                cursors[workspace], more = page["next_cursor"], page["has_more"]
            missing += len(set(load.acknowledged().values()) - seen[workspace])
        waited = time.monotonic() - started
        if not missing:
            return waited
        assert waited < PROJECTED_WITHIN_S, (
            f"{missing} acknowledged tasks still not in the feeds {waited:.0f}s after the load:"
            " no node's projection loop leads again after the failovers")
        time.sleep(0.5)


def leader_after_the_failovers(url: str, settings: Settings, nodes: list[ServedProcess],
                               since: float) -> float:
    """Seconds (from the call) until the database's primary *as it is now*
    shows the projection leader's advisory lock granted to a session opened
    after the last failover (``since``) by a worker of one of ``nodes``, and
    that same process's LISTEN session: the lock moved and LISTEN reconnected.
    (The read models alone would not show it: each Runtime scan also catches
    them up.)"""
    import psycopg

    assert settings.postgres is not None
    started = time.monotonic()
    groups = {node.process.pid for node in nodes}
    found: list[Any] = []
    while True:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as primary:
            age_limit = time.monotonic() - since
            found = primary.execute(
                "SELECT a.application_name, EXTRACT(EPOCH FROM now() - a.backend_start),"
                " (SELECT count(*) FROM pg_stat_activity w WHERE w.application_name ="
                "   replace(a.application_name, 'projection-leader', 'listener')"
                "   AND EXTRACT(EPOCH FROM now() - w.backend_start) < %s)"
                " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                " WHERE l.locktype = 'advisory' AND l.granted"
                " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                " AND l.classid = %s AND l.objid = %s AND l.objsubid = 2",
                (age_limit, *lock_key(settings.postgres.schema)),
            ).fetchall()
        if len(found) == 1:
            name, age, listeners = found[0]
            process = int(name.rsplit("-", 1)[1])
            with contextlib.suppress(ProcessLookupError):
                if (float(age) < age_limit and listeners == 1
                        and os.getpgid(process) in groups):
                    return time.monotonic() - started
        assert time.monotonic() - started < PROJECTED_WITHIN_S, (
            f"no projection leader with a fresh lock and LISTEN on the primary: {found}")
        time.sleep(0.5)


def feed_task_created(settings: Settings) -> dict[str, int]:
    services = inspect(settings)
    try:
        services.projections.catch_up()
        with services.database.transaction() as tx:
            rows = tx.execute(
                "SELECT data FROM feed_events WHERE type = 'task.created'")
    finally:
        services.close()
    counts: dict[str, int] = {}
    for (data,) in rows:
        task_id = str(json.loads(data)["id"]) if isinstance(data, str) else str(data["id"])
        counts[task_id] = counts.get(task_id, 0) + 1
    return counts


def two_api_nodes(
    tmp_path: Path, settings_a: Settings, settings_b: Settings
) -> tuple[ServedProcess, ServedProcess]:
    """Two served API nodes on one store, each logging in its own folder."""
    nodes = []
    for name, settings in (("a", settings_a), ("b", settings_b)):
        (tmp_path / f"logs-{name}").mkdir()
        nodes.append(ServedProcess(settings, tmp_path / f"logs-{name}", workers=WORKERS,
                                   KANDEV_LEASE_SECONDS=str(LEASE_S), KANDEV_LOG_LEVEL="WARNING"))
    return nodes[0], nodes[1]


@pytest.mark.parametrize("profile", [
    pytest.param(SHORT, id="short", marks=pytest.mark.timeout(600)),
    pytest.param(LONG_PROFILE, id="long", marks=[
        pytest.mark.slow, pytest.mark.timeout(1800),
        pytest.mark.skipif(not LONG, reason="long form: set KANDEV_LONG_FAILOVER=1")]),
])
def test_two_api_nodes_ride_unplanned_and_planned_failovers_losing_nothing(
    profile: Profile, formation: tuple[Path, str], tmp_path: Path
) -> None:
    directory, url = formation
    started = time.monotonic()
    schema = f"chaos_{uuid.uuid4().hex[:8]}"
    database_url = f"{url}&schema={schema}"
    roots = (tmp_path / "repos",)
    settings_a = Settings(data_dir=tmp_path / "a", database_url=database_url,
                          repository_roots=roots)
    settings_b = Settings(data_dir=tmp_path / "b", database_url=database_url,
                          repository_roots=roots)
    repository = make_git_repository(roots[0] / "backend")

    init = run_cli(settings_a, "db", "init")
    assert init.returncode == 0, init.stderr
    assert init.stdout.splitlines()[1].startswith("durable: 1 synchronous standby"), init.stdout

    node_a, node_b = two_api_nodes(tmp_path, settings_a, settings_b)
    loads: list[CreateLoad] = []
    figures: dict[str, Any] = {"failovers": []}
    windows: list[tuple[float, float]] = []
    try:
        token = node_a.token
        assert token is not None and node_b.workspace_id == node_a.workspace_id
        ready = http("GET", node_a.base + "/readyz")
        assert ready.body["durability"]["durable"] is True, ready.body
        assert ready.body["durability"]["synchronous_standbys"] == 1, ready.body
        # One workspace per node, so each load's end state is checked whole.
        made = http("POST", node_b.base + "/api/v1/workspaces", token,
                    {"name": "second", "task_prefix": "SEC"})
        assert made.status == 201, made
        # The after-failover probes create in a third, so the loads' ends stay exact.
        probe = http("POST", node_a.base + "/api/v1/workspaces", token,
                     {"name": "probe", "task_prefix": "PRB"})
        assert probe.status == 201, probe
        # Creates with a real effect (a branch and a worktree in a registered
        # repository) in a workspace of their own, one client: two concurrent
        # git commands on one repository may meet each other's lock files.
        effects = _workspace(node_b.base, token, "effects")
        registered = http("POST", f"{node_b.base}/api/v1/workspaces/{effects}/repositories",
                          token, {"name": "backend", "path": str(repository)})
        assert registered.status == 201, registered
        for node, workspace in ((node_a, node_a.workspace_id), (node_b, made.body["id"])):
            loads.append(CreateLoad(node.base, token, [workspace],
                                    prefix=f"F{uuid.uuid4().hex[:6]}",
                                    clients=profile.clients, timeout=CLIENT_TIMEOUT_S).start())
        loads.append(CreateLoad(node_b.base, token, [effects], prefix=f"E{uuid.uuid4().hex[:6]}",
                                clients=1, timeout=CLIENT_TIMEOUT_S,
                                fields={"repositories": ["backend"]}).start())
        time.sleep(profile.warmup_s)
        assert all(load.acknowledged() for load in loads), [summary(x.snapshot()) for x in loads]

        for _ in range(profile.rounds):
            for unplanned in (True, False):
                since = time.monotonic()
                writable = failover(directory, unplanned)
                returned = time.monotonic()
                # The client library rides what is left (503 + Retry-After).
                probe_s = created_again(node_a.base, token, probe.body["id"], returned)
                windows.append((since, time.monotonic() + 1.0))
                figures["failovers"].append({
                    "kind": "unplanned" if unplanned else "planned",
                    "database_writable_after_s": writable,
                    "client_create_after_the_command_s": round(probe_s, 1),
                })
                time.sleep(1.0)  # the load's answers after the probe close the window
                if unplanned:
                    # The new primary is alone until the old one rejoins: it
                    # takes writes (pg_auto_failover's choice), and says so.
                    alone = http("GET", node_b.base + "/readyz")
                    assert alone.body["durability"]["durable"] is False, alone.body
                    rejoin(directory)
                time.sleep(profile.between_s)
        time.sleep(profile.after_s)
        for load in loads:
            load.stop()
        for failed_over, (start, end) in zip(figures["failovers"], windows, strict=True):
            gap = seconds_without_created(loads, start, end)
            failed_over["load_without_created_s"] = round(gap, 1)
            assert gap < BACK_WITHIN_S, figures["failovers"]
        # Created after the last failover: the feeds below can only hold them
        # if a projection loop leads on the database as it is now.
        last = windows[-1][1]
        figures["acknowledged_after_the_last_failover"] = sum(
            1 for load in loads for a in load.snapshot() if a.acknowledged_created
            and a.ended > last)
        assert figures["acknowledged_after_the_last_failover"], figures
        figures["projection_leader_back_s"] = round(leader_after_the_failovers(
            url, settings_a, [node_a, node_b], windows[-1][0]), 1)
        # Each workspace's feed read through the node that did not create it.
        figures["feeds_caught_up_by_themselves_s"] = round(feeds_catch_up_by_themselves(
            [(node_b.base, loads[0]), (node_a.base, loads[1]), (node_a.base, loads[2])],
            token), 1)
        check_the_end_state(loads, settings_a, figures, tmp_path)
        figures["effects"] = assert_one_branch_and_worktree_per_task(
            node_a.base, token, effects, repository, (settings_a, settings_b))
    finally:
        for load in loads:
            load.stop()
        node_a.stop()
        node_b.stop()
    figures["test_s"] = round(time.monotonic() - started, 1)
    report(f"failover[{'long' if profile is LONG_PROFILE else 'short'}]", figures)


def check_the_end_state(
    loads: list[CreateLoad], settings: Settings, figures: dict[str, Any], tmp_path: Path
) -> None:
    """With both API nodes still serving: every answer typed, nothing lost or
    doubled (each load's IDs retried until settled), the feed, audit verify."""
    attempts = [a for load in loads for a in load.snapshot()]
    record(tmp_path, attempts, [])
    figures.update(summary(attempts))
    span = max(a.ended for a in attempts) - min(a.started for a in attempts)
    created = sum(1 for a in attempts if a.acknowledged_created)
    figures["created_per_s"] = round(created / span, 1)  # failovers included
    figures["typed_503"] = sum(1 for a in attempts if a.status == 503 and a.error in TYPED_503)
    figures["http_500"] = sum(1 for a in attempts if a.status == 500)
    # No connection errors: the API nodes stayed up; only the database failed over.
    assert_answers_are_typed(attempts, connection_errors_allowed=False)

    # Acknowledged-then-lost, counted before the checks that require it to be 0.
    lost = 0
    for load in loads:
        for external_id, task_id in load.acknowledged().items():
            status, body = load.lookup(external_id)
            lost += not (status == 200 and body["id"] == task_id)
    figures["acknowledged_then_lost"] = lost

    holders: dict[str, str] = {}
    services = inspect(settings)
    try:
        for index, load in enumerate(loads):
            mine = load.snapshot()
            outcome = assert_nothing_lost_or_doubled(load, services, mine)
            figures[("node_a", "node_b", "effects_via_b")[index]] = outcome
            holders.update({a.external_id: a.task_id for a in mine
                            if a.acknowledged_created and a.task_id})
    finally:
        services.close()
    feed = feed_task_created(settings)
    doubled = {task: n for task, n in feed.items() if n != 1}
    assert not doubled, f"task.created more than once: {doubled}"
    missing = [task for task in holders.values() if task not in feed]
    assert not missing, f"acknowledged Created without a task.created: {missing[:5]}"
    verify = run_cli(settings, "audit", "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr


def assert_one_branch_and_worktree_per_task(
    base: str, token: str, workspace: str, repository: Path, nodes: tuple[Settings, ...]
) -> dict[str, int]:
    """The repository holds ``main`` plus exactly one ``kandev/<identifier>``
    branch and one worktree (``<a node's data dir>/worktrees/<task id>/backend``)
    per task of the workspace: no effect performed twice, none left behind by
    an aborted creation."""
    tasks: list[dict[str, Any]] = []
    after: int | None = 0
    while after is not None:
        status, page, _, failure = call(
            "GET", f"{base}/api/v1/workspaces/{workspace}/tasks?limit=500&after={after}",
            token, timeout=CLIENT_TIMEOUT_S)
        assert status == 200, (status, page, failure)
        tasks += page["items"]
        after = page["next_cursor"]
    assert tasks, "no task with a repository"
    assert branches(repository) == sorted(
        ["main", *(f"kandev/{task['identifier']}" for task in tasks)])
    trees = [Path(tree) for tree in worktrees(repository)]
    homes = [Path(node.data_dir).resolve() / "worktrees" for node in nodes]
    assert all(tree.name == "backend" and tree.parent.parent in homes for tree in trees), trees
    assert sorted(tree.parent.name for tree in trees) == sorted(task["id"] for task in tasks)
    return {"tasks": len(tasks),
            **{f"worktrees_by_node_{'ab'[i]}": sum(t.parent.parent == home for t in trees)
               for i, home in enumerate(homes)}}


def _workspace(base: str, token: str, name: str, wip_limit: int | None = None) -> str:
    made = http("POST", base + "/api/v1/workspaces", token,
                {"name": name, "task_prefix": name[:3].upper()})
    assert made.status == 201, made
    if wip_limit is not None:  # a policy step on every create: a kill can leave one preparing
        policy = http("PUT", f"{base}/api/v1/workspaces/{made.body['id']}/policy", token,
                      {"wip_limit": wip_limit})
        assert policy.status == 200, policy
    return str(made.body["id"])


def in_flight_creations(settings: Settings, workspaces: list[str]) -> int:
    services = inspect(settings)
    try:
        services.projections.catch_up()
        with services.database.transaction() as tx:
            return sum(
                len(tx.execute("SELECT 1 FROM creations_view WHERE workspace_id = ?", (w,)))
                for w in workspaces)
    finally:
        services.close()


@pytest.mark.timeout(600)
def test_a_killed_api_node_leaves_its_creations_to_the_other_nodes_runtime(
    tmp_path: Path,
) -> None:
    """Two API nodes on one database (the suite's server: this is about the
    nodes); node B is SIGKILLed (its whole process group) mid-load. Node A
    serves on without an error, and its Runtime settles every creation B left
    in flight within the lease plus a few Runtime scans, each exactly once
    (the WIP ledger holds one slot per live task), nothing acknowledged lost."""
    from tests.conftest import postgres_admin_url

    started = time.monotonic()
    separator = "&" if "?" in postgres_admin_url() else "?"
    url = f"{postgres_admin_url()}{separator}schema=nodes_{uuid.uuid4().hex[:8]}"
    settings_a = Settings(data_dir=tmp_path / "a", database_url=url)
    settings_b = Settings(data_dir=tmp_path / "b", database_url=url)
    assert run_cli(settings_a, "db", "init").returncode == 0
    node_a, node_b = two_api_nodes(tmp_path, settings_a, settings_b)
    figures: dict[str, Any] = {}
    try:
        token = node_a.token
        assert token is not None
        b_workspaces = [_workspace(node_a.base, token, "bplain"),
                        _workspace(node_a.base, token, "bstepped", wip_limit=100_000)]
        load_a = CreateLoad(node_a.base, token, [node_a.workspace_id], prefix="NA",
                            clients=SHORT.clients, timeout=CLIENT_TIMEOUT_S).start()
        load_b = CreateLoad(node_b.base, token, b_workspaces, prefix="NB",
                            clients=SHORT.clients, timeout=CLIENT_TIMEOUT_S).start()
        try:
            time.sleep(SHORT.warmup_s)
            assert load_b.acknowledged(), summary(load_b.snapshot())
            killed_at = time.monotonic()
            os.killpg(node_b.process.pid, 9)
            load_b.stop()
            figures["in_flight_at_kill"] = in_flight_creations(settings_a, b_workspaces)
            # Node A's Runtime settles what B left in flight (lease + scans),
            # while A's own load goes on.
            while in_flight_creations(settings_a, b_workspaces):
                assert time.monotonic() - killed_at < LEASE_S + 20, "B's creations never settled"
                time.sleep(0.2)
            figures["settled_after_kill_s"] = round(time.monotonic() - killed_at, 1)
            time.sleep(1.0)
        finally:
            load_b.stop()
            load_a.stop()
        # Node A's clients never noticed; node B's saw their connections drop.
        assert_answers_are_typed(load_a.snapshot(), connection_errors_allowed=False)
        assert_answers_are_typed(load_b.snapshot(), connection_errors_allowed=True)
        load_b.base = node_a.base  # B's clients retry through A
        services = inspect(settings_a)
        try:
            figures["node_b"] = assert_nothing_lost_or_doubled(
                load_b, services, load_b.snapshot())
            figures["node_a"] = assert_nothing_lost_or_doubled(
                load_a, services, load_a.snapshot())
        finally:
            services.close()
        figures["dropped_connections_b"] = sum(1 for a in load_b.snapshot() if a.status is None)
        figures["node_a_load"] = summary(load_a.snapshot())
    finally:
        node_a.stop()
        node_b.stop()
    figures["test_s"] = round(time.monotonic() - started, 1)
    report("api node SIGKILL", figures)
