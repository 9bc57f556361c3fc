"""Scaling: kandev-es against the CRUD peer (scripts/crud_peer.py) over HTTP at
each client count, in rounds that alternate which server goes first; the
figures are medians over the rounds."""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg

from benchlib.checkpoints import CheckpointProber, coverage_under_load
from benchlib.common import (
    LAG_CLIENTS,
    REPO,
    body,
    concurrent_count,
    concurrent_rate,
    failed_requests,
    load_average,
    median_over,
    ratio,
    round_probes,
    say,
)
from benchlib.cost import COST_CONFIG, COST_NOTE, cost_tables, same_servers
from benchlib.cpu import PostgresSide
from benchlib.lag import LagProber
from benchlib.server import Client, Gunicorn, db_init, environment, gthread_server, poster
from kandev_es.bootstrap import Services
from kandev_es.config import Settings, postgres_target

MEDIAN_FIELDS = {  # field of a scaling.http row: digits it is rounded to
    "kandev_created_per_s": 1, "peer_created_per_s": 1, "created_ratio": 3,
    "kandev_found_per_s": 1, "peer_found_per_s": 1, "found_ratio": 3,
    # the peer as usually deployed (gunicorn -k gthread), when measured
    "gthread_peer_created_per_s": 1, "deployed_created_ratio": 3,
    "gthread_peer_found_per_s": 1, "deployed_found_ratio": 3,
}
# The CRUD peer under gunicorn's gthread worker, how most Flask apps are deployed.
GTHREAD_PEER = "peer_gthread"
SIDES = ("kandev", "peer", GTHREAD_PEER)


def round_order(number: int, sides: tuple[str, ...] = ("kandev", "peer")) -> tuple[str, ...]:
    """The order the servers are measured in at each client count in round
    ``number`` (from 1): as given in odd rounds, reversed in even ones, so that
    no side always runs on the machine as another left it."""
    return sides if number % 2 else tuple(reversed(sides))


def rate_row(clients: int, rates: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """One round's row at ``clients``: each side's (created/s, found/s), the
    kandev/peer ratios (same server), the kandev/gthread-peer ratios when that
    side was measured, and ``order``, the sides in the order they were measured."""
    (kandev_created, kandev_found), (created, found) = rates["kandev"], rates["peer"]
    row: dict[str, Any] = {
        "clients": clients,
        "kandev_created_per_s": round(kandev_created, 1),
        "peer_created_per_s": round(created, 1),
        "created_ratio": ratio(kandev_created, created),
        "kandev_found_per_s": round(kandev_found, 1),
        "peer_found_per_s": round(found, 1),
        "found_ratio": ratio(kandev_found, found),
    }
    if GTHREAD_PEER in rates:
        deployed_created, deployed_found = rates[GTHREAD_PEER]
        row.update({
            "gthread_peer_created_per_s": round(deployed_created, 1),
            "deployed_created_ratio": ratio(kandev_created, deployed_created),
            "gthread_peer_found_per_s": round(deployed_found, 1),
            "deployed_found_ratio": ratio(kandev_found, deployed_found),
        })
    return {**row, "order": list(rates)}


def median_rows(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per client count (in the order first measured), the median over the
    rounds of each rate and of each ratio (the median of the rounds' ratios,
    not the ratio of the median rates), and how many rounds it is the median of."""
    by_count: dict[int, list[dict[str, Any]]] = {}
    for rows in rounds:
        for row in rows:
            by_count.setdefault(row["clients"], []).append(row)
    return [
        {
            "clients": clients,
            **{
                field: round(statistics.median(row[field] for row in rows), digits)
                for field, digits in MEDIAN_FIELDS.items()
                if all(field in row for row in rows)
            },
            "rounds": len(rows),
        }
        for clients, rows in by_count.items()
    ]


def median_nested(probes: list[dict[str, Any]], key: str, part: str) -> float | None:
    """The median over the rounds of ``probe[key][part]`` (None where absent)."""
    values = [p[key][part] for p in probes if p.get(key) and p[key][part] is not None]
    return round(statistics.median(values), 1) if values else None


def lag_under_load(rounds: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The rounds' projection lags under load: the median of their p50s and of
    their p99s (the p99 is what the target reads), samples and missing summed;
    None when no round probed (LAG_CLIENTS not among the client counts)."""
    probes = round_probes(rounds, "projection_lag_under_load")
    if not probes:
        return None
    return {
        "clients": LAG_CLIENTS,
        "p50_ms": median_over(probes, "p50_ms", 1),
        "p99_ms": median_over(probes, "p99_ms", 1),
        "samples": sum(probe["samples"] for probe in probes),
        "missing": sum(probe["missing"] for probe in probes),
        "not_listed_at_once": sum(probe.get("not_listed_at_once", 0) for probe in probes),
        "first_poll_had_it": sum(probe.get("first_poll_had_it", 0) for probe in probes),
        "polls_max": max(probe.get("polls_max", 0) for probe in probes),
        "first_poll_round_trip_ms_p50": median_nested(probes, "first_poll_round_trip_ms", "p50"),
        "first_poll_round_trip_ms_p99": median_nested(probes, "first_poll_round_trip_ms", "p99"),
        "created_round_trip_ms_p50": median_nested(probes, "created_round_trip_ms", "p50"),
        "created_round_trip_ms_p99": median_nested(probes, "created_round_trip_ms", "p99"),
        "failed_requests": failed_requests(probes),
        "stream": {
            "p50_ms": median_nested(probes, "stream", "p50_ms"),
            "p99_ms": median_nested(probes, "stream", "p99_ms"),
            "samples": sum((probe.get("stream") or {}).get("samples", 0) for probe in probes),
            "missing": sum((probe.get("stream") or {}).get("missing", 0) for probe in probes),
        },
        "rounds": len(probes),
        "note": f"while kandev-es takes the {LAG_CLIENTS}-client Created load, a thread of the"
        " bench creates its own tasks one at a time (20 ms apart) and times each from the HTTP"
        " acknowledgement to its task.created in the feed over HTTP (GET .../events), and"
        " lists the workspace's tasks by its external ID right after the acknowledgement"
        " (not_listed_at_once: how many were not there); those creates count in no rate."
        " first_poll_had_it: samples whose first poll after the acknowledgement already had"
        " the row (the lag is then that GET's round trip); *_round_trip_ms: a feed poll's and"
        " the probe's own Created's round trips under the same load (medians of the rounds)."
        " stream: the same probes' task.created as a consumer of the SSE stream"
        " (GET .../events/stream, opened at the start of the load) received them, ms after"
        " the acknowledgement (negative: pushed before the creating client had its answer)."
        " p50_ms and p99_ms are medians over the rounds (each round's own under 'rounds')",
    }


class Probes:
    """Probers that run together during a Created load (start() to stop())."""

    def __init__(self, *probes: LagProber | CheckpointProber) -> None:
        self.probes = probes

    def start(self) -> None:
        for probe in self.probes:
            probe.start()

    def stop(self) -> None:
        """In the order given: a probe's stop may wait (the lag prober's for
        its stream to end), so a sampling one goes first, never sampling on
        past the load."""
        for probe in self.probes:
            probe.stop()


def http_rates(
    port: int, token: str, workspace: uuid.UUID, clients: int, seconds: float,
    found_outcome: str, prefix: str, during_created: Probes | None = None,
) -> tuple[float, float, Counter[str]]:
    """(created/s, found/s, failures) at ``clients`` keep-alive connections;
    ``during_created`` runs from the release of the Created load's clients to
    their stop."""
    held = body(workspace, f"{prefix}-FOUND")
    status, reply = Client(port, token).request("POST", "/api/v1/tasks", held)
    assert status == 200 and reply["outcome"] in ("created", found_outcome), (status, reply)
    failures: Counter[str] = Counter()

    calls, elapsed = concurrent_count(
        lambda: poster(port, token, lambda: body(workspace, f"{prefix}-{uuid.uuid4()}"), "created",
                       failures),
        clients, seconds,
        during_created.start if during_created else lambda: None,
        during_created.stop if during_created else lambda: None,
    )
    found = concurrent_rate(
        lambda: poster(port, token, lambda: held, found_outcome, failures), clients, seconds
    )
    return calls / elapsed, found, failures


def scaling(
    settings: Settings, admin_url: str, url: str, schema: str, tmp: Path,
    services: Services, workers: int, client_counts: list[int], seconds: float,
    cost_clients: list[int] | None = None, settle_s: float = 11.0, rounds: int = 1,
) -> dict[str, Any]:
    """Creates/s and Found/s over HTTP at each client count, kandev-es and the
    CRUD peer (scripts/crud_peer.py) side by side: same PostgreSQL, same
    gunicorn config, same KANDEV_WORKERS and KANDEV_THREADS. Ratios are
    kandev/peer. The measurement is repeated ``rounds`` times, the order of the
    two servers alternating (round_order); the figures are medians over the
    rounds (median_rows). In each round, while kandev-es takes the Created load
    at LAG_CLIENTS clients, a LagProber measures the projection lag."""
    env = environment(url, tmp / "data")
    db_init(env)
    peer_schema = f"{schema}_peer"
    peer_url = postgres_target(admin_url).conninfo
    peer_script = str(REPO / "scripts" / "crud_peer.py")
    peer = [sys.executable, peer_script]
    subprocess.run([*peer, "init", peer_url, peer_schema], check=True, timeout=60,
                   stdin=subprocess.DEVNULL)
    try:
        workspace = services.workspaces.open("bench-scaling", "BSC")
        token, _ = services.tokens.issue(workspace_id=workspace.id, admin=False)
        peer_workspace = uuid.uuid4()
        peer_token = subprocess.run(
            [*peer, "token", peer_url, peer_schema, str(peer_workspace)], check=True,
            timeout=60, capture_output=True, text=True, stdin=subprocess.DEVNULL,
        ).stdout.strip()
        rounds_run: list[dict[str, Any]] = []
        failures: dict[str, Counter[str]] = {side: Counter() for side in SIDES}
        say(f"scaling: kandev-es and the CRUD peer, {workers} workers each,"
            f" clients {client_counts}, measured in turn at each count")
        peer_env = {
            **{k: v for k, v in env.items() if not k.startswith("PEER_")},
            "PEER_DATABASE_URL": peer_url, "PEER_SCHEMA": peer_schema,
            # its own data dir: the gunicorn config empties <data dir>/metrics
            # when a server starts, which must not touch the running kandev-es
            "KANDEV_DATA_DIR": str(tmp / "peer-data"),
        }
        # Both servers run throughout and are measured one right after the other
        # at each client count, so a noisy minute on a shared machine falls on
        # both sides of a ratio rather than deciding it.
        # Both from the same gunicorn config (http/gunicorn.conf.py, run as is
        # by a wrapper that adds the CPU sampler to post_fork, idle until the
        # cost phase), the same environment but for the peer's own variables.
        config = tmp / "gunicorn-cost.conf.py"
        config.write_text(COST_CONFIG.format(
            config=str(REPO / "http" / "gunicorn.conf.py"), scripts=str(REPO / "scripts")))
        cost_dirs = {"kandev": tmp / "cost-kandev", "peer": tmp / "cost-peer"}
        for directory in cost_dirs.values():
            directory.mkdir()
        with contextlib.ExitStack() as servers:
            server = Gunicorn({**env, "BENCH_COST_DIR": str(cost_dirs["kandev"]),
                               "BENCH_COST_SIDE": "kandev"}, workers,
                              tmp / "gunicorn-scaling.log", config=config)
            servers.callback(server.stop)
            peer_server = Gunicorn(
                {**peer_env, "BENCH_COST_DIR": str(cost_dirs["peer"]),
                 "BENCH_COST_SIDE": "peer"}, workers,
                tmp / "gunicorn-peer.log",
                ("--pythonpath", str(REPO / "scripts"), "crud_peer:create_app()"),
                config=config,
            )
            servers.callback(peer_server.stop)
            gthread_peer = gthread_server(peer_env, workers, tmp / "gunicorn-peer-gthread.log")
            servers.callback(gthread_peer.stop)
            sides = {
                "kandev": (server.port, token, workspace.id, "found_settled"),
                "peer": (peer_server.port, peer_token, peer_workspace, "found"),
                GTHREAD_PEER: (gthread_peer.port, peer_token, peer_workspace, "found"),
            }
            for number in range(1, rounds + 1):
                order = round_order(number, SIDES)
                say(f"scaling round {number}/{rounds}: in the order {', '.join(order)}")
                this: dict[str, Any] = {
                    "round": number, "first": order[0], "load_before": load_average(), "http": [],
                }
                for clients in client_counts:
                    rates: dict[str, tuple[float, float]] = {}
                    for side in order:
                        port, side_token, side_workspace, found_outcome = sides[side]
                        prober = covers = None
                        if side == "kandev" and clients == LAG_CLIENTS:
                            prober = LagProber(port, side_token, side_workspace, url, schema)
                            covers = CheckpointProber(port, side_token, side_workspace, url,
                                                      schema)
                        created, found, failed = http_rates(
                            port, side_token, side_workspace, clients, seconds, found_outcome,
                            f"SC{clients}", Probes(covers, prober) if prober and covers else None,
                        )
                        failures[side].update(failed)
                        rates[side] = (created, found)  # in the order measured
                        if prober is not None and covers is not None:
                            this["projection_lag_under_load"] = {
                                "clients": clients, **prober.result(),
                            }
                            this["checkpoint_coverage_under_load"] = {
                                "clients": clients, **covers.result(),
                            }
                    this["http"].append(rate_row(clients, rates))
                rounds_run.append(this)
            if cost_clients:
                pg = PostgresSide(admin_url)
                costs = cost_tables(
                    {"kandev": (server, cost_dirs["kandev"], token, workspace.id,
                                "found_settled"),
                     "peer": (peer_server, cost_dirs["peer"], peer_token, peer_workspace,
                              "found")},
                    pg, cost_clients, seconds, settle_s,
                )
    finally:
        with contextlib.suppress(psycopg.Error), psycopg.connect(
            peer_url, autocommit=True
        ) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{peer_schema}" CASCADE')
    rows = median_rows([run["http"] for run in rounds_run])
    for row in rows:
        say(f"scaling {row['clients']:>3} clients: created {row['created_ratio']}x peer,"
            f" found {row['found_ratio']}x peer; as deployed: created"
            f" {row.get('deployed_created_ratio')}x, found {row.get('deployed_found_ratio')}x"
            f" the peer on gthread (median of {row['rounds']} rounds)")
    section: dict[str, Any] = {
        "workers": workers,
        "threads_per_worker": os.environ.get("KANDEV_THREADS") or "8 (gunicorn.conf.py default)",
        "http": rows,
        "rounds": rounds_run,
        "failed_requests": {side: dict(count) for side, count in failures.items()},
        "note": "ratios are kandev/peer; both served by http/gunicorn.conf.py on the same"
        " PostgreSQL, both running, measured one right after the other at each client count;"
        " deployed_* ratios are kandev/the same peer under gunicorn -k gthread (same workers,"
        " KANDEV_THREADS threads), how most Flask apps are deployed;"
        " 'http' holds per client count the median over the rounds of each rate and of each"
        " ratio, 'rounds' every round's own rows (kandev-es first in odd rounds, the peer"
        " first in even ones) and the load average (1, 5, 15 min) before it",
    }
    under_load = lag_under_load(rounds_run)
    if under_load is not None:
        section["projection_lag_under_load"] = under_load
    coverage = coverage_under_load(rounds_run)
    if coverage is not None:
        section["checkpoint_coverage_under_load"] = coverage
        say(f"checkpoint coverage under the {LAG_CLIENTS}-client Created load: p50"
            f" {coverage['p50_s']} s, p99 {coverage['p99_s']} s, max {coverage['max_s']} s"
            f" ({coverage['samples']} samples, {coverage['missing']} missing)")
    if cost_clients:
        section.update(costs)
        section["servers"] = same_servers(costs)
        section["cost_note"] = COST_NOTE
    return section
