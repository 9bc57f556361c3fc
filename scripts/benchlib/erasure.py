"""What erasure costs (issue 47, docs/auditing.md: Erasure): Created over HTTP
with each task's free text sealed under its own key (event format 1) against
the same with KANDEV_SEAL_FREE_TEXT off (cleartext, format 0), on servers
started afresh, the two alternating which goes first in each round (as the
'chains' section: medians of the rounds, each round's load beside them; CPU
per Created, gunicorn's and PostgreSQL's, and its ratio sealed / cleartext);
and how long forgetting a task with 100 events takes, in-process."""

from __future__ import annotations

import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from benchlib.common import load_average, ratio, say
from benchlib.cpu import PostgresSide
from benchlib.server import db_init, environment
from benchlib.tracing import served_creates
from kandev_es.bootstrap import Services
from kandev_es.domain.principal import LOCAL_CLI

FORGET_EVENTS = 100
FORGET_TASKS = 3


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
) -> dict[str, Any]:
    section: dict[str, Any] = {"load_before": load_average()}
    say(f"Created over HTTP sealed vs cleartext, {rounds} round(s)")
    section["created_over_http"] = _created(
        url, tmp, services, workers, clients, seconds, rounds, PostgresSide(admin_url), initialised
    )
    say(f"forgetting a task with {FORGET_EVENTS} events, {FORGET_TASKS} tasks")
    section["forget"] = forget_timing(services)
    section["load_after"] = load_average()
    return section


def _created(
    url: str,
    tmp: Path,
    services: Services,
    workers: int,
    clients: int,
    seconds: float,
    rounds: int,
    postgres: PostgresSide,
    initialised: bool,
) -> dict[str, Any]:
    workspace = services.workspaces.open("bench-erasure", "BER")
    token, _ = services.tokens.issue(workspace_id=workspace.id, admin=False)
    env = environment(url, tmp / "data")
    if not initialised:
        db_init(env)
    envs = {
        "sealed": {**env, "KANDEV_SEAL_FREE_TEXT": "y"},
        "cleartext": {**env, "KANDEV_SEAL_FREE_TEXT": "n"},
    }
    runs = []
    for number in range(rounds):
        order = ["sealed", "cleartext"] if number % 2 == 0 else ["cleartext", "sealed"]
        run: dict[str, Any] = {"order": order, "load": load_average()}
        for side in order:
            run[side] = served_creates(
                side,
                envs[side],
                None,
                workers,
                clients,
                seconds,
                token,
                workspace.id,
                tmp / f"erasure-{side}-{number}.log",
                postgres,
            )
        runs.append(run)
    return {
        "workers": workers,
        "clients": clients,
        "sealed_per_s": _median(runs, "sealed"),
        "cleartext_per_s": _median(runs, "cleartext"),
        "cpu_ms_per_created": {
            side: _median(runs, side, "cpu_ms_per_created") for side in ("sealed", "cleartext")
        },
        "pg_cpu_ms_per_created": {
            side: _median(runs, side, "pg_cpu_ms_per_created") for side in ("sealed", "cleartext")
        },
        # CPU per Created, sealed / cleartext (server's and PostgreSQL's): target <= 1.05
        "cpu_ratio": round(
            statistics.median(ratio(_cpu(r["sealed"]), _cpu(r["cleartext"])) for r in runs), 3
        ),
        "rounds": runs,
    }


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


def _median(runs: list[dict[str, Any]], side: str, key: str = "created_per_s") -> float:
    return round(statistics.median(r[side].get(key, 0.0) for r in runs), 3)
