"""What feed consumers cost the writers (issue 48, docs/benchmarks.md): Created
over HTTP at --clients on --workers with 0, 1, 10 and 50 SSE consumers of the
workspace feed (in a process of their own, benchlib/fanout_consumers.py, each
stream drained as it comes), each count on a server started afresh, the
counts' order reversed every other round. The stream caps are raised for the
run (KANDEV_MAX_STREAMS and KANDEV_MAX_STREAMS_PER_TOKEN: 50 consumers over 32
a worker). Per count:
Created/s and its ratio to no consumer in the same round, the servers' and
PostgreSQL's CPU per Created, whether every consumer got every task.created of
the load once (``missing``, ``twice``), the servers' CPU per frame
delivered to one consumer: (CPU per Created with N - with none) / N, and the
consumers' own CPU per frame they received (on the same cores, not the
server's)."""

from __future__ import annotations

import http.client
import json
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from benchlib.common import WAIT_S, body, concurrent_count, load_average, ratio, say
from benchlib.cpu import PostgresSide, cpu_delta, family_cpu
from benchlib.fanout_apart import streams_apart
from benchlib.server import Client, Gunicorn, db_init, environment
from benchlib.statements import Statements, statement_deltas
from kandev_es.bootstrap import Services

CONSUMERS = (0, 1, 10, 50)
TARGETS = {1: 0.95, 10: 0.9, 50: 0.75}  # Created/s with N consumers / with none


class Consumers:
    """``count`` SSE consumers of the workspace feed, in a process of their own
    (benchlib/fanout_consumers.py: one thread, a regular expression over what
    arrives), so that neither their interpreter lock nor their parsing slows
    the bench's client threads; their CPU is reported beside the server's."""

    def __init__(self, port: int, token: str, workspace: uuid.UUID, after: int,
                 count: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("fanout_consumers.py")), str(port),
             token, str(workspace), str(after), str(count), str(WAIT_S)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None and self.process.stdin is not None
        ready = self.process.stdout.readline().strip()
        if ready != "ready":
            self.stop()
            raise SystemExit(f"the consumers did not start: {ready!r}")

    def delivered(self, made: list[str]) -> dict[str, Any]:
        """Waits (up to WAIT_S) for every consumer to have every task, then says
        how many each missed or got twice, and the consumers' CPU per frame."""
        assert self.process.stdout is not None and self.process.stdin is not None
        self.process.stdin.write(json.dumps(made) + "\n")
        self.process.stdin.flush()
        answer = json.loads(self.process.stdout.readline() or "{}")
        frames = max(int(answer.get("frames", 0)), 1)
        return {"missing": answer.get("missing", len(made)), "twice": answer.get("twice", 0),
                "ended": answer.get("ended", {}),
                "consumer_cpu_us_per_frame": round(answer.get("cpu_ns", 0) / 1e3 / frames, 2)}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=WAIT_S)


def _head(port: int, token: str, workspace: uuid.UUID) -> int:
    """The workspace feed's last position (its JSON feed paged to the end)."""
    client, after = Client(port, token), 0
    while True:
        status, page = client.request("GET", f"/api/v1/workspaces/{workspace}/events"
                                      f"?after={after}&limit=1000")
        assert status == 200, page
        after = page["next_cursor"]
        if not page["has_more"]:
            return int(after)


def _creates(port: int, token: str, workspace: uuid.UUID, made: list[str],
             failures: Counter[str]) -> Any:
    """One client's call: a create, its task id noted in ``made``."""
    client = Client(port, token)

    def run() -> None:
        try:
            status, reply = client.request(
                "POST", "/api/v1/tasks", body(workspace, f"FAN-{uuid.uuid4()}"))
        except (OSError, http.client.HTTPException) as error:
            failures[type(error).__name__] += 1
            return
        if status != 200 or reply.get("outcome") != "created":
            failures[f"{status}:{(reply or {}).get('error')}"] += 1
            return
        made.append(reply["id"])

    return run


def one_count(env: dict[str, str], workers: int, clients: int, seconds: float, count: int,
              token: str, workspace: uuid.UUID, log: Path,
              postgres: PostgresSide, statements: Statements | None = None) -> dict[str, Any]:
    """Created/s with ``count`` consumers, on a server started afresh; with
    ``statements`` (pg_stat_statements there), what each statement cost."""
    server = Gunicorn(env, workers, log)
    consumers: Consumers | None = None
    made: list[str] = []
    failures: Counter[str] = Counter()
    spent: dict[str, Any] = {}
    try:
        after = _head(server.port, token, workspace)
        if count:
            consumers = Consumers(server.port, token, workspace, after, count)
        time.sleep(1.0)  # each caught up and joined its worker's reader
        done, elapsed = concurrent_count(
            lambda: _creates(server.port, token, workspace, made, failures), clients, seconds,
            started_hook=lambda: spent.update(
                cpu=family_cpu(server.process.pid), pg=postgres.cpu(), made=len(made),
                statements=statements and statements.reading()),
            stopped_hook=lambda: spent.update(
                cpu=cpu_delta(spent["cpu"], family_cpu(server.process.pid)),
                pg=None if spent["pg"] is None else cpu_delta(spent["pg"], postgres.cpu() or {}),
                statements_after=statements and statements.reading()),
        )
        delivered = consumers.delivered(made) if consumers else {}
    finally:
        if consumers is not None:
            consumers.stop()
        server.stop()
    timed = max(len(made) - spent["made"], 1)
    result = {"consumers": count, "created_per_s": round(done / elapsed, 1),
              "cpu_us_per_created": round(spent["cpu"] / 1e3 / timed, 1),
              "failed": dict(failures), **delivered}
    if spent["pg"] is not None:
        result["pg_cpu_us_per_created"] = round(spent["pg"] / 1e3 / timed, 1)
    by_statement = statement_deltas(spent["statements"], spent["statements_after"], timed)
    if by_statement is not None:
        result["statements"] = by_statement
    return result


def fanout_cost(url: str, tmp: Path, services: Services, workers: int, clients: int,
                seconds: float, rounds: int, admin_url: str, initialised: bool = False,
                counts: tuple[int, ...] = CONSUMERS, apart: bool = False) -> dict[str, Any]:
    """The 'fanout' section: ``rounds`` rounds over ``counts``, alternating order;
    with ``apart``, then the streams' cost to a streaming server of their own
    (benchlib/fanout_apart.py) for each count but 0."""
    section: dict[str, Any] = {"load_before": load_average(), "workers": workers,
                               "clients": clients}
    workspace = services.workspaces.open("bench-fanout", "BFO")
    token, _ = services.tokens.issue(workspace_id=workspace.id, admin=False)
    most = max(counts)
    env = environment(url, tmp / "data", KANDEV_MAX_STREAMS=str(max(32, most + 8)),
                      KANDEV_MAX_STREAMS_PER_TOKEN=str(max(8, most)))
    if not initialised:
        db_init(env)
    postgres = PostgresSide(admin_url)
    statements = Statements(admin_url)
    runs = []
    for number in range(rounds):
        order = list(counts) if number % 2 == 0 else list(reversed(counts))
        say(f"fanout round {number + 1}/{rounds}: consumers {order}")
        run: dict[str, Any] = {"order": order, "load": load_average()}
        for count in order:
            run[str(count)] = one_count(env, workers, clients, seconds, count, token,
                                        workspace.id, tmp / f"fanout-{count}-{number}.log",
                                        postgres, statements)
        runs.append(run)
    section.update(summary(runs, counts))
    if apart:
        say("fanout apart: a streaming server of its own")
        section["apart"] = streams_apart(env, [c for c in counts if c], seconds, token,
                                         workspace.id, tmp)
    section["load_after"] = load_average()
    return section


def summary(runs: list[dict[str, Any]], counts: tuple[int, ...]) -> dict[str, Any]:
    """Medians over the rounds per consumer count; ratios to no consumer taken
    within each round; the servers' CPU per frame and consumer."""
    table = {}
    for count in counts:
        key = str(count)
        row: dict[str, Any] = {
            "created_per_s": _median(runs, key, "created_per_s"),
            "cpu_us_per_created": _median(runs, key, "cpu_us_per_created"),
            "missing": sum(r[key].get("missing", 0) for r in runs),
            "twice": sum(r[key].get("twice", 0) for r in runs),
        }
        if all("pg_cpu_us_per_created" in r[key] for r in runs):
            row["pg_cpu_us_per_created"] = _median(runs, key, "pg_cpu_us_per_created")
        if count:
            row["consumer_cpu_us_per_frame"] = _median(runs, key, "consumer_cpu_us_per_frame")
            row["ratio"] = round(statistics.median(
                ratio(r[key]["created_per_s"], r["0"]["created_per_s"]) for r in runs), 3)
            row["cpu_us_per_frame_per_consumer"] = round(statistics.median(
                (r[key]["cpu_us_per_created"] - r["0"]["cpu_us_per_created"]) / count
                for r in runs), 2)
        table[key] = row
    return {"by_consumers": table, "rounds": runs}


def _median(runs: list[dict[str, Any]], key: str, field: str) -> float:
    return round(float(statistics.median(r[key].get(field, 0.0) for r in runs)), 1)


def fanout_targets(section: dict[str, Any]) -> dict[str, Any]:
    """Issue 48's: Created/s with 1, 10, 50 consumers >= 0.95x, 0.9x, 0.75x
    without; every consumer got every task.created once."""
    from benchlib.targets import judged

    rounds = len(section["rounds"])
    result = {}
    for count, least in TARGETS.items():
        row = section["by_consumers"].get(str(count))
        measured = None if row is None else row["ratio"]
        result[f"created_with_{count}_consumers_vs_none"] = judged(
            f">= {least}", measured, measured is not None and measured >= least, rounds)
    lost = sum(row["missing"] + row["twice"] for row in section["by_consumers"].values())
    result["every_consumer_every_task_once"] = judged("== 0 missing or twice", lost, lost == 0,
                                                      rounds)
    return result
