"""What erasure costs (issue 47, docs/auditing.md: Erasure): Created over HTTP
with each task's free text sealed under its own key (event format 1) against
the same with KANDEV_SEAL_FREE_TEXT off (cleartext, format 0), and how long
forgetting a task with 100 events takes, in-process.

The two sides run AT THE SAME TIME, each its own gunicorn (started afresh each
round) on a database of its own, and every client thread alternates its
requests between them, so both see the same machine: the same load from other
work, the same CPU frequency, the same caches. Measured one after the other
(the section's first form, as 'chains' does), the rounds of a loaded machine
disagreed by more than the 5 % judged (ratios 0.93-1.28 in one run). Per side:
its gunicorn family's CPU (workers, master, background process) and
PostgreSQL's: its own database's backends and autovacuum workers (the process
title names the database), plus half the cluster's shared processes (WAL
writer, checkpointer...; also reported whole). Each round starts settled (both
servers and PostgreSQL near idle). The ratio, sealed / cleartext, is the
median of the rounds'."""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from benchlib.common import body, concurrent_count, load_average, ratio, say
from benchlib.cpu import PostgresSide, cpu_delta, cpu_ns, family_cpu, ppid_of
from benchlib.server import Gunicorn, db_init, environment, poster
from kandev_es.bootstrap import Services, bootstrap
from kandev_es.config import Settings, postgres_target
from kandev_es.domain.principal import LOCAL_CLI

FORGET_EVENTS = 100
FORGET_TASKS = 3
SIDES = {"sealed": "y", "cleartext": "n"}
# Settled: a QUIET_S window in which the servers and PostgreSQL together used
# at most QUIET_SHARE of one core; waited for at most SETTLE_S.
QUIET_S = 0.5
QUIET_SHARE = 0.05
SETTLE_S = 30.0
SHARED = "shared"
WARM_UP = 2  # creates per client and side before the measurement


def erasure_cost(
    url: str,
    tmp: Path,
    services: Services,
    workers: int,
    clients: int,
    seconds: float,
    rounds: int,
    admin_url: str,
    initialised: bool = False,
    a_a: bool = False,
) -> dict[str, Any]:
    """``url``/``initialised``: the bench's own store, where the forget timing
    runs; the Created sides get a database each (dropped afterwards). ``a_a``
    (--erasure-a-a): the same comparison again with both sides sealed, whose
    ratio should be 1: the method's own spread and bias on this machine."""
    section: dict[str, Any] = {"load_before": load_average()}
    say(f"Created over HTTP sealed vs cleartext, side by side, {rounds} round(s)")
    postgres = PostgresSide(admin_url)
    section["created_over_http"] = _created(
        admin_url, tmp, workers, clients, seconds, rounds, postgres, SIDES
    )
    if a_a:
        say(f"the same with both sides sealed (A/A), {rounds} round(s)")
        section["created_a_a"] = _created(
            admin_url, tmp, workers, clients, seconds, rounds, postgres, dict.fromkeys(SIDES, "y")
        )
    say(f"forgetting a task with {FORGET_EVENTS} events, {FORGET_TASKS} tasks")
    section["forget"] = forget_timing(services)
    section["load_after"] = load_average()
    return section


class Side:
    """One side's store: a database of its own, `kandev-es db init` run on it,
    a workspace and a member token, and the environment its servers run with."""

    def __init__(self, admin_url: str, tmp: Path, name: str, seal: str) -> None:
        self.name = name
        self.database = f"bench_erasure_{name}_{uuid.uuid4().hex[:8]}"
        self.admin = postgres_target(admin_url).conninfo
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.database}"')
        url = urlunsplit(urlsplit(admin_url)._replace(path=f"/{self.database}"))
        data = tmp / f"erasure-{name}-{self.database[-8:]}"
        self.env = environment(url, data, KANDEV_SEAL_FREE_TEXT=seal)
        self.settings = Settings(data_dir=data, database_url=url)
        try:
            db_init(self.env)
            services = bootstrap(self.settings)
            try:
                workspace = services.workspaces.open(f"bench-erasure-{name}", "BER")
                self.token, _ = services.tokens.issue(workspace_id=workspace.id, admin=False)
                self.workspace = workspace.id
            finally:
                services.close()
        except BaseException:
            self.drop()
            raise

    def stored_format(self) -> int | None:
        """The event format of the side's stored tasks, as written (1: sealed,
        0: cleartext), read back from its database: the switch took."""
        services = bootstrap(self.settings)
        try:
            for event in services.app.recorder.select_notifications(start=1, limit=200):
                if event.topic.endswith(("Task.Created", "Task.CreatedActive")):
                    return 1 if b'"sealed":' in bytes(event.state) else 0
        finally:
            services.close()
        return None

    def drop(self) -> None:
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(self.admin, autocommit=True) as conn,
        ):
            conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')


def _created(
    admin_url: str, tmp: Path, workers: int, clients: int, seconds: float, rounds: int,
    postgres: PostgresSide, flags: dict[str, str],
) -> dict[str, Any]:  # fmt: skip
    """The rounds of one comparison; ``flags``: each side's KANDEV_SEAL_FREE_TEXT."""
    sides: list[Side] = []
    try:
        for name in SIDES:
            sides.append(Side(admin_url, tmp, name, flags[name]))
        runs = []
        for number in range(rounds):
            order = sides if number % 2 == 0 else sides[::-1]
            say(f"erasure round {number + 1}/{rounds}: {', '.join(s.name for s in order)}")
            runs.append(_round(order, workers, clients, seconds, postgres, tmp, number))
        formats = {side.name: side.stored_format() for side in sides}
    finally:
        for side in sides:
            side.drop()
    return {
        "workers": workers,
        "clients": clients,
        "method": "side by side: both servers at once, each client alternating between them",
        "stored_format": formats,
        "created_per_s": _median([r["created_per_s"] for r in runs]),  # both sides
        "cpu_ms_per_created": {
            side: _median([r[side]["cpu_ms_per_created"] for r in runs]) for side in SIDES
        },
        "pg_cpu_ms_per_created": {
            side: _median([r[side]["pg_cpu_ms_per_created"] for r in runs]) for side in SIDES
        },
        # CPU per Created, sealed / cleartext (server's and PostgreSQL's): target <= 1.05
        "cpu_ratio": _median([r["cpu_ratio"] for r in runs]),
        "rounds": runs,
    }


def _round(
    order: list[Side], workers: int, clients: int, seconds: float, postgres: PostgresSide,
    tmp: Path, number: int,
) -> dict[str, Any]:  # fmt: skip
    run: dict[str, Any] = {"order": [side.name for side in order], "load": load_average()}
    servers: dict[str, Gunicorn] = {}
    try:
        for side in order:
            servers[side.name] = Gunicorn(side.env, workers, tmp / f"{side.database}-{number}.log")
        run["settle"] = settle(servers, postgres, order)
        counts: Counter[str] = Counter()
        failures: Counter[str] = Counter()
        lock = threading.Lock()
        readings: dict[str, Any] = {}

        def started() -> None:
            counts.clear()  # the warm-up calls are not counted
            readings["before"] = _readings(servers, postgres, order)

        def stopped() -> None:
            readings["after"] = _readings(servers, postgres, order)

        total, elapsed = concurrent_count(
            lambda: _alternating(order, servers, counts, failures, lock),
            clients,
            seconds,
            started_hook=started,
            stopped_hook=stopped,
        )
    finally:
        for server in servers.values():
            server.stop()
    run.update(_per_side(order, readings["before"], readings["after"], counts, elapsed))
    run["created_per_s"] = round(total / elapsed, 1)
    run["failed"] = dict(failures)
    run["cpu_ratio"] = ratio(_cpu(run["sealed"]), _cpu(run["cleartext"]))
    return run


def _alternating(
    order: list[Side], servers: dict[str, Gunicorn], counts: Counter[str],
    failures: Counter[str], lock: threading.Lock,
) -> Callable[[], None]:  # fmt: skip
    """One client's call: the next side's create, in turn (its own keep-alive
    connection to each server, warmed by WARM_UP creates each); each
    acknowledged create counted to its side."""
    calls = []
    for side in order:
        mine: Counter[str] = Counter()
        post = poster(servers[side.name].port, side.token, _bodies(side), "created", mine)
        calls.append((side.name, post, mine))
        for _ in range(WARM_UP):  # outside the measurement: both servers' workers warm
            post()
    turn = [0]

    def call() -> None:
        name, post, mine = calls[turn[0] % len(calls)]
        turn[0] += 1
        failed = sum(mine.values())
        post()
        with lock:
            if sum(mine.values()) == failed:
                counts[name] += 1
            else:
                failures.update({f"{name}:{k}": v for k, v in mine.items()})
                mine.clear()

    return call


def _bodies(side: Side) -> Callable[[], dict[str, Any]]:
    """A fresh create's body for ``side``'s workspace (a new external ID each)."""
    return lambda: body(side.workspace, f"ER-{uuid.uuid4()}")


def _readings(
    servers: dict[str, Gunicorn], postgres: PostgresSide, order: list[Side]
) -> dict[str, dict[int, int]]:
    """CPU ns by pid: each server's family; PostgreSQL's processes by the
    database their title names (SHARED: the rest of the cluster's)."""
    found = {f"server:{name}": family_cpu(server.process.pid) for name, server in servers.items()}
    pg: dict[str, dict[int, int]] = {side.name: {} for side in order}
    pg[SHARED] = {}
    if postgres.postmaster is not None:
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or ppid_of(int(entry)) != postgres.postmaster:
                continue
            try:
                title = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            owner = next((s.name for s in order if s.database in title), SHARED)
            pg[owner][int(entry)] = cpu_ns(int(entry))
    return {**found, **{f"pg:{name}": pids for name, pids in pg.items()}}


def _per_side(
    order: list[Side], before: dict[str, dict[int, int]], after: dict[str, dict[int, int]],
    counts: Counter[str], elapsed: float,
) -> dict[str, Any]:  # fmt: skip
    spent = {name: cpu_delta(before.get(name, {}), after[name]) for name in after}
    shared = spent.get(f"pg:{SHARED}", 0)
    result: dict[str, Any] = {"pg_shared_cpu_ms": round(shared / 1e6, 1)}
    for side in order:
        count = max(counts[side.name], 1)
        result[side.name] = {
            "created": counts[side.name],
            "created_per_s": round(counts[side.name] / elapsed, 1),
            "cpu_ms_per_created": round(spent[f"server:{side.name}"] / 1e6 / count, 3),
            "pg_cpu_ms_per_created": round(
                (spent[f"pg:{side.name}"] + shared / len(order)) / 1e6 / count, 3
            ),
        }
    return result


def settle(
    servers: dict[str, Gunicorn], postgres: PostgresSide, order: list[Side]
) -> dict[str, Any]:
    """Wait until the servers (just started: imports, a first checkpoint...)
    and PostgreSQL are near idle: a QUIET_S window in which they used at most
    QUIET_SHARE of a core, for at most SETTLE_S."""
    started = time.monotonic()
    quiet = False
    while not quiet and time.monotonic() - started < SETTLE_S:
        before = _readings(servers, postgres, order)
        time.sleep(QUIET_S)
        after = _readings(servers, postgres, order)
        used = sum(cpu_delta(before.get(name, {}), after[name]) for name in after)
        quiet = used <= QUIET_SHARE * QUIET_S * 1e9
    return {"seconds": round(time.monotonic() - started, 2), "settled": quiet}


def forget_timing(services: Services) -> dict[str, Any]:
    """Seconds to forget a task whose stream holds FORGET_EVENTS events
    (Created and its edits), median and worst of FORGET_TASKS tasks."""
    workspace = services.workspaces.open(f"bench-forget-{uuid.uuid4().hex[:6]}", "BFG")
    spent = []
    for _ in range(FORGET_TASKS):
        made = services.creation.create(
            LOCAL_CLI, {"workspace_id": str(workspace.id), "title": "Jane Doe's laptop"}
        )
        task_id = uuid.UUID(made.to_response()["id"])
        for number in range(FORGET_EVENTS - 1):
            services.tasks.patch(LOCAL_CLI, task_id, {"description": f"call Jane, {number}"})
        started = time.perf_counter()
        services.forgetting().forget(LOCAL_CLI, task_id, "bench", f"bench-{task_id}")
        spent.append(time.perf_counter() - started)
    return {
        "events": FORGET_EVENTS,
        "tasks": FORGET_TASKS,
        "median_s": round(statistics.median(spent), 4),
        "max_s": round(max(spent), 4),
    }


def _cpu(side: dict[str, Any]) -> float:
    return float(side["cpu_ms_per_created"] + side.get("pg_cpu_ms_per_created", 0.0))


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3)
