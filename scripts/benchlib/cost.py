"""Cost per request by component (the scaling section's cost_per_created and
cost_per_found): the servers' and PostgreSQL's CPU across a load, split by the
workers' samplers (scripts/cost_sampler.py), with commits and pool waits."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib.common import body, concurrent_count, say
from benchlib.cpu import PostgresSide, cpu_delta, family_cpu
from benchlib.server import Client, Gunicorn, poster

COST_CONFIG = """# written by scripts/bench: http/gunicorn.conf.py as is, plus CPU timers at
# the component boundaries of each worker (scripts/cost_sampler.py), off until
# the bench names a phase in $BENCH_COST_DIR/phase
import os as _os
import sys as _sys

_path = {config!r}
with open(_path) as _file:
    exec(compile(_file.read(), _path, "exec"))
_served_post_fork = post_fork


def post_fork(server, worker):
    _served_post_fork(server, worker)
    _sys.path.insert(0, {scripts!r})
    import cost_sampler

    cost_sampler.start(_os.environ["BENCH_COST_DIR"], _os.environ["BENCH_COST_SIDE"], worker)
"""


REST = "HTTP server and the rest"


COMPONENT_NAMES = (
    REST, "Flask + API", "auth", "reads", "event decoding", "creation and event building",
    "event encoding", "save statement (+NOTIFY)", "NOTIFY after saves", "office number",
    "projection runner",
    "projection tasks", "projection creations", "projection identities", "projection feeds",
)


def set_phase(directory: Path, phase: str) -> None:
    partial = directory / "phase.tmp"
    partial.write_text(phase)
    partial.replace(directory / "phase")


def sampled(
    directory: Path, phase: str, workers: int
) -> tuple[dict[str, int], dict[str, int], list[dict[str, Any]]]:
    """(CPU ns by timed component, pool statistics, each worker's facts) for
    ``phase`` over the ``workers`` of a server, once each has written it
    (within 5 s)."""
    cpu: Counter[str] = Counter()
    pools: Counter[str] = Counter()
    facts: list[dict[str, Any]] = []
    deadline = time.monotonic() + 5
    while True:
        files = sorted(directory.glob("*.json"))
        tables = [json.loads(path.read_text()) for path in files]
        written = [table for table in tables if phase in table["phases"]]
        if len(written) >= workers or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for table in tables:
        facts.append(table["facts"])
        entry = table["phases"].get(phase)
        if entry is None:
            continue
        cpu.update(entry["cpu_ns"])
        pools.update({k: v for k, v in entry.get("pools", {}).items() if k != "pool_max"})
    return dict(cpu), dict(pools), facts


def cost_window(
    server: Gunicorn, directory: Path, pg: PostgresSide, phase: str, settle_s: float,
    clients: int,
    load: Callable[[Callable[[], None], Callable[[], None]], tuple[int, float]],
) -> dict[str, Any]:
    """CPU µs per request by component, for one load against ``server``:
    the server processes' CPU (/proc: gunicorn master and workers) split by the
    workers' samplers in proportion, PostgreSQL's CPU, commits and write
    transactions per request."""
    readings: dict[str, Any] = {}
    master = server.process.pid

    def started() -> None:
        set_phase(directory, phase)
        time.sleep(4 * 0.05)  # the workers poll the phase every 50 ms
        readings["server"] = family_cpu(master)
        readings["postgres"] = pg.cpu()
        readings["background"] = background_writes(server.port)
        readings["xids"] = pg.counters()[1]

    def stopped() -> None:
        readings["server_after"] = family_cpu(master)
        readings["postgres_after"] = pg.cpu()
        readings["xids_after"] = pg.counters()[1]
        readings["background_after"] = background_writes(server.port)
        set_phase(directory, "")

    # PostgreSQL flushes an idle backend's counters within 10 s: a settle for
    # the last load's, then one more to measure what the idle servers commit
    # by themselves (leader lock, runtime scans), subtracted below.
    time.sleep(settle_s)
    quiet_commits, quiet_at = pg.counters()[0], time.monotonic()
    time.sleep(settle_s)
    commits_before, before_at = pg.counters()[0], time.monotonic()
    background_per_s = (commits_before - quiet_commits) / max(before_at - quiet_at, 1e-9)
    requests, elapsed = load(started, stopped)
    time.sleep(settle_s)
    commits_after = pg.counters()[0]
    background = background_per_s * (time.monotonic() - before_at) if settle_s > 0 else 0.0
    requests = max(requests, 1)
    per_op = 1e-3 / requests  # µs per request of one ns
    master_us = (readings["server_after"][master] - readings["server"].get(master, 0)) * per_op
    server_us = cpu_delta(readings["server"], readings["server_after"]) * per_op
    workers_us = server_us - master_us
    timed_ns, pools, facts = sampled(directory, phase, server.workers)
    components: dict[str, float] = {name: 0.0 for name in COMPONENT_NAMES}
    walls = {name: ns for name, ns in timed_ns.items() if ":" in name}
    for name, ns in timed_ns.items():
        if ":" not in name:
            components[name] = components.get(name, 0.0) + ns * per_op
    # the rest of the workers' CPU: outside every timed boundary
    components[REST] = max(0.0, workers_us - sum(components.values()))
    components["gunicorn master"] = master_us
    postgres_us = None
    if readings["postgres"] is not None and readings["postgres_after"] is not None:
        postgres_us = cpu_delta(readings["postgres"], readings["postgres_after"]) * per_op
        components["postgres"] = postgres_us
    rounded = {name: round(value, 1) for name, value in components.items()}
    return {
        "requests": requests,
        "per_s": round(requests / elapsed, 1),
        "total_us": round(sum(rounded.values()), 1),
        "server_processes_us": round(server_us, 1),
        "postgres_us": None if postgres_us is None else round(postgres_us, 1),
        "components_us": rounded,
        "commits_per_op": round(
            max(0.0, commits_after - commits_before - background) / requests, 2
        ),
        "background_commits_per_s": round(background_per_s, 1),
        **write_transactions(readings, requests, elapsed),
        # Where a request's time goes, not only its CPU: per request, ms spent in
        # each component (exclusive wall time, CPU and waiting: I/O, a pooled
        # connection, a lock, the GIL) and in the app as a whole (Flask's
        # wsgi_app), beside the latency the clients saw (clients / rate).
        "wall_ms_per_op": {
            name.removeprefix("wall:"): round(ns * per_op / 1000, 3)
            for name, ns in sorted(walls.items()) if name.startswith("wall:")
        },
        "app_ms_per_op": round(
            sum(ns for name, ns in walls.items() if name.startswith("inclusive wall:"))
            * per_op / 1000, 3
        ),
        "latency_ms": round(clients * elapsed / requests * 1000, 2),
        "pool": {
            "waited_per_op": round(pools.get("requests_queued", 0) / requests, 3),
            "wait_ms_per_op": round(pools.get("requests_wait_ms", 0) / requests, 3),
            "checkouts_per_op": round(pools.get("requests_num", 0) / requests, 2),
        },
        "workers": facts,
    }


BACKGROUND_WRITES = re.compile(
    r'^kandev_background_write_transactions_total\{writer="(\w+)"\} ([0-9.e+]+)$', re.M
)


def background_writes(port: int) -> dict[str, float] | None:
    """The server's background writers' write transactions so far, by writer
    (``kandev_background_write_transactions_total`` at /metrics, every worker
    added up); None from a server that does not count them (the peer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
    except urllib.error.HTTPError:
        return None
    if "kandev_background_write_transactions" not in text:
        return None
    return {writer: float(value) for writer, value in BACKGROUND_WRITES.findall(text)}


def write_transactions(
    readings: dict[str, Any], requests: int, elapsed: float
) -> dict[str, Any]:
    """Write transactions (xids assigned, exact) per request: in all, and the
    requests' own — all less those the background writers counted where they
    committed, read from /metrics just inside the xid readings."""
    total = readings["xids_after"] - readings["xids"]
    result: dict[str, Any] = {"write_transactions_per_op": round(total / requests, 3)}
    before, after = readings.get("background"), readings.get("background_after")
    if before is None or after is None:
        return result
    background = {w: after.get(w, 0.0) - before.get(w, 0.0) for w in after}
    spent = sum(background.values())
    result["request_path_write_transactions_per_op"] = round((total - spent) / requests, 3)
    result["background_write_transactions_per_s"] = {
        "all": round(spent / elapsed, 2),
        **{w: round(n / elapsed, 2) for w, n in sorted(background.items())},
    }
    return result


def created_body(workspace: uuid.UUID) -> Callable[[], dict[str, Any]]:
    return lambda: body(workspace, f"COST-{uuid.uuid4()}")


def posting_load(
    port: int, token: str, make_body: Callable[[], dict[str, Any]], outcome: str,
    clients: int, seconds: float,
) -> tuple[Callable[[Callable[[], None], Callable[[], None]], tuple[int, float]], Counter[str]]:
    """A load of ``clients`` keep-alive connections POSTing ``make_body()``
    for ``seconds`` (run with the window's hooks), and its failure counts."""
    failures: Counter[str] = Counter()

    def load(started: Callable[[], None], stopped: Callable[[], None]) -> tuple[int, float]:
        return concurrent_count(
            lambda: poster(port, token, make_body, outcome, failures),
            clients, seconds, started, stopped,
        )

    return load, failures


def cost_tables(
    sides: dict[str, tuple[Gunicorn, Path, str, uuid.UUID, str]], pg: PostgresSide,
    client_counts: list[int], seconds: float, settle_s: float,
) -> dict[str, Any]:
    """cost_per_created and cost_per_found at each count, kandev-es and the peer."""
    tables: dict[str, list[dict[str, Any]]] = {"cost_per_created": [], "cost_per_found": []}
    for clients in client_counts:
        rows: dict[str, dict[str, Any]] = {
            "cost_per_created": {"clients": clients}, "cost_per_found": {"clients": clients},
        }
        for side, (server, directory, token, workspace, found_outcome) in sides.items():
            held = body(workspace, f"COST{clients}-FOUND")
            status, reply = Client(server.port, token).request("POST", "/api/v1/tasks", held)
            assert status == 200, (status, reply)
            for table, make_body, outcome in (
                ("cost_per_created", created_body(workspace), "created"),
                ("cost_per_found", lambda held=held: held, found_outcome),
            ):
                phase = f"{side}-{table}-{clients}"
                say(f"cost: {phase}")
                load, failures = posting_load(
                    server.port, token, make_body, outcome, clients, seconds
                )
                row = cost_window(server, directory, pg, phase, settle_s, clients, load)
                row["failed_requests"] = dict(failures)
                rows[table][side] = row
        for table, row in rows.items():
            tables[table].append(row)
    return tables


COST_NOTE = (
    "CPU microseconds per request over HTTP, one load per row (--cost-clients clients for"
    " --seconds). Server processes: the run time of every thread of the gunicorn master"
    " and its workers (/proc/<pid>/task/*/schedstat) across the load. Inside the workers,"
    " the functions bounding each component are timed with the thread's own CPU clock,"
    " exclusive of nested components (scripts/cost_sampler.py lists them, the same way for"
    " kandev-es and the peer); 'HTTP server and the rest' is the workers' CPU outside every"
    " boundary (waitress' I/O and request threads, WSGI glue, pool upkeep). postgres: the"
    " run time of every child of the postmaster (backends of both servers and the"
    " background writers; the idle server's share is small). kandev-es's save is one"
    " statement, which also writes the read models and feed rows (inline projections);"
    " with every read model inline no NOTIFY follows it ('NOTIFY after saves' is 0; with an"
    " asynchronous view it is sent by one thread per worker, coalesced over 5 ms)"
    " ('save statement (+NOTIFY)' is the save alone for kandev-es, the peer's whole insert"
    " transaction). kandev-es draws the office number in its lookup statement when this"
    " worker's snapshots admit the create ('reads'), else with a statement of its own"
    " ('office number'); the peer inside its INSERT. The projection loop only moves tracked"
    " positions (one worker, at most every 0.5 s). commits_per_op:"
    " pg_stat_database.xact_commit across the load and --cost-settle seconds before and"
    " after (backends flush their counters within 10 s when idle; read-only statements"
    " count), less the idle servers' own rate (background_commits_per_s, measured over a"
    " second settle before the load); write_transactions_per_op: xids assigned (exact)"
    " across the load; request_path_write_transactions_per_op: those less the ones the"
    " server's background writers committed meanwhile (the projection loop's tracked"
    " positions, the ledger's sequencer and checkpoints), which count each where it commits"
    " (kandev_background_write_transactions_total at /metrics, read just inside the xid"
    " readings): background_write_transactions_per_s."
    " pool: psycopg_pool checkouts and waits for a connection per request. wall_ms_per_op:"
    " per request, ms of thread time spent in each component (CPU and waiting: I/O, a"
    " pooled connection, a lock, the GIL); app_ms_per_op: in Flask's wsgi_app as a whole;"
    " latency_ms: what a client waited (clients x seconds / requests), the difference is"
    " time in the HTTP server (queued for a thread, parsing, writing)."
)


def same_servers(costs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """What each server ran, as its workers reported it: worker class, threads,
    workers, pooled connections; ``same`` when both sides match but the pool."""
    seen: dict[str, dict[str, Any]] = {}
    for row in costs["cost_per_created"] + costs["cost_per_found"]:
        for side in ("kandev", "peer"):
            for fact in row[side]["workers"]:
                seen[side] = {**seen.get(side, {}), **fact}
    keys = ("worker_class", "threads", "workers")
    return {
        **seen,
        "same": all(
            seen.get("kandev", {}).get(key) == seen.get("peer", {}).get(key) for key in keys
        ),
    }
