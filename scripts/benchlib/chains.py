"""What hash chains cost in the save (issue 36, docs/auditing.md: What chains
cost): the store's save with chains against the same save with
KANDEV_LEDGER_SAVE_CHAINS off (benchlib/saves.py), and Created over HTTP on
servers started afresh with chains on and off, the two alternating which goes
first in each round. Ratios are medians of the rounds' ratios, each round's
load average beside them; beside the rates, CPU per operation (the savers' or
gunicorn's processes and PostgreSQL's) and its ratio, without / with: what the
rate ratio is on a machine the load saturates, and steadier than the rates
on one busy with other work."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from benchlib.common import load_average, ratio, say
from benchlib.cpu import PostgresSide
from benchlib.saves import chained_saves
from benchlib.server import db_init, environment
from benchlib.tracing import served_creates
from kandev_es.bootstrap import Services
from kandev_es.config import Settings


def chains_cost(
    settings: Settings, admin_url: str, url: str, tmp: Path, services: Services,
    save_clients: list[int], workers: int, clients: int, seconds: float, rounds: int,
    initialised: bool = False,
) -> dict[str, Any]:
    """``initialised``: `kandev-es db init` already ran on the store (the full
    run's HTTP part did), so the servers start without running it again."""
    section: dict[str, Any] = {"load_before": load_average()}
    say(f"saves with chains vs without, {rounds} round(s)")
    section["saves"] = chained_saves(settings, admin_url, save_clients, seconds, rounds)
    say(f"Created over HTTP with chains vs without, {rounds} round(s)")
    section["created_over_http"] = _created(url, tmp, services, workers, clients, seconds,
                                            rounds, PostgresSide(admin_url), initialised)
    section["load_after"] = load_average()
    return section


def _created(url: str, tmp: Path, services: Services, workers: int, clients: int,
             seconds: float, rounds: int, postgres: PostgresSide,
             initialised: bool) -> dict[str, Any]:
    workspace = services.workspaces.open("bench-chains", "BCH")
    token, _ = services.tokens.issue(workspace_id=workspace.id, admin=False)
    env = environment(url, tmp / "data")
    if not initialised:
        db_init(env)
    envs = {"with": {**env, "KANDEV_LEDGER_SAVE_CHAINS": "y"},
            "without": {**env, "KANDEV_LEDGER_SAVE_CHAINS": "n"}}
    runs = []
    for number in range(rounds):
        order = ["with", "without"] if number % 2 == 0 else ["without", "with"]
        run: dict[str, Any] = {"order": order, "load": load_average()}
        for side in order:
            run[side] = served_creates(side, envs[side], None, workers, clients, seconds,
                                       token, workspace.id, tmp / f"chains-{side}-{number}.log",
                                       postgres)
        runs.append(run)
    return {
        "workers": workers, "clients": clients,
        "with_chains_per_s": _median(runs, "with"),
        "without_chains_per_s": _median(runs, "without"),
        # CPU per Created (gunicorn's processes / PostgreSQL's), medians of the rounds:
        # steadier than the rates on a machine busy with other work
        "cpu_ms_per_created": {side: _median(runs, side, "cpu_ms_per_created")
                               for side in ("with", "without")},
        "pg_cpu_ms_per_created": {side: _median(runs, side, "pg_cpu_ms_per_created")
                                  for side in ("with", "without")},
        "ratio": round(statistics.median(
            ratio(r["with"]["created_per_s"], r["without"]["created_per_s"]) for r in runs), 3),
        "cpu_ratio": round(statistics.median(
            ratio(_cpu(r["without"]), _cpu(r["with"])) for r in runs), 3),
        "rounds": runs,
    }


def _cpu(side: dict[str, Any]) -> float:
    """CPU ms per Created, the server's and PostgreSQL's."""
    return float(side["cpu_ms_per_created"] + side.get("pg_cpu_ms_per_created", 0.0))


def _median(runs: list[dict[str, Any]], side: str, key: str = "created_per_s") -> float:
    return round(statistics.median(r[side].get(key, 0.0) for r in runs), 3)
