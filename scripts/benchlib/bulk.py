"""The 'bulk' section (issue 44's benchmark): a backlog of ``items``
effect-free creates imported by ONE client in chunks of ``chunk`` through
POST /api/v1/tasks/batch, beside kandev-es's own single creates from one client,
the CRUD peer's single creates at 16 clients, and the peer's batch route (one
INSERT ... SELECT FROM unnest ... ON CONFLICT DO NOTHING RETURNING). Both servers
run throughout from the same gunicorn config; each round measures them in turn,
the order alternating; figures are medians over the rounds. Also the kandev-es
workers' peak RSS during one 1,000-item request."""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from benchlib.common import REPO, body, concurrent_count, load_average, say
from benchlib.cost import COST_CONFIG, REST, sampled, set_phase
from benchlib.cpu import PostgresSide, cpu_delta, family_cpu
from benchlib.server import Client, Gunicorn, db_init, environment, poster
from kandev_es.bootstrap import Services
from kandev_es.config import postgres_target
from kandev_es.storage import ledger as ledger_store

PEER_CLIENTS = 16
RSS_ITEMS = 1_000
# Settled: the ledger holds every stored event and, over QUIET_S, the servers'
# processes and PostgreSQL's together used at most what they use idle (their
# lease renewals, scans, the samplers' polls: the least of IDLE_WINDOWS windows
# once both are up) times IDLE_FACTOR plus QUIET_SHARE of one core; waited
# for at most SETTLE_S. Catching up uses a whole core, idle a few percent.
QUIET_S = 0.5
IDLE_WINDOWS = 6
IDLE_FACTOR = 1.5
QUIET_SHARE = 0.03
SETTLE_S = 120.0
POLL_S = 0.05


class Settler:
    """Waits, before each measurement, until the work left over from the last
    one is done: kandev-es's ledger sequencer has logged every stored event
    and neither server (its workers, and a background process of its master's)
    nor PostgreSQL is still busy (the projection loop, the ledger's hashing and
    signing, autovacuum...), so that a measurement never pays for the one
    before it. The work a measurement causes itself is its own and stays in
    it (``measured_batch``, ``batch_cost``)."""

    def __init__(self, services: Services, servers: dict[str, Gunicorn],
                 pg: PostgresSide) -> None:
        self.services, self.servers, self.pg = services, servers, pg
        # Each family's CPU (by pid) when the last wait found all quiet.
        self.at_settle: dict[str, dict[int, int]] = {}
        self.idle_ns = min(self.window()[0] for _ in range(IDLE_WINDOWS))
        self.quiet_ns = IDLE_FACTOR * self.idle_ns + QUIET_SHARE * QUIET_S * 1e9

    def window(self) -> tuple[int, dict[str, dict[int, int]], dict[str, dict[int, int]]]:
        """CPU ns all used over QUIET_S, and the readings before and after."""
        before = self.readings()
        time.sleep(QUIET_S)
        after = self.readings()
        return sum(cpu_delta(before[name], after[name]) for name in after), before, after

    def logged(self) -> bool:
        """Whether the ledger's last leaf is the last stored event."""
        head = self.services.app.recorder.max_notification_id() or 0
        with self.services.database.transaction() as tx:
            _, last = ledger_store.tree_head(tx)
        return last >= head

    def readings(self) -> dict[str, dict[int, int]]:
        """CPU ns by pid: each server's master and children, PostgreSQL's processes."""
        found = {side: family_cpu(server.process.pid) for side, server in self.servers.items()}
        return {**found, "postgres": self.pg.cpu() or {}}

    def wait(self) -> dict[str, Any]:
        """Seconds until the ledger held every event (``logged_s``) and until
        a QUIET_S window began in which all used no more than idle (``quiet_s``,
        see QUIET_S); the CPU ms each family used until then (``busy_ms``)."""
        started = time.monotonic()
        deadline = started + SETTLE_S
        while not self.logged() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        logged_s = time.monotonic() - started
        first = before = self.readings()
        quiet, at = False, time.monotonic()
        while not quiet and time.monotonic() < deadline:
            at = time.monotonic()
            used, before, _ = self.window()
            quiet = used <= self.quiet_ns
        self.at_settle = before
        return {"logged_s": round(logged_s, 2), "quiet_s": round(at - started, 2),
                "settled": quiet and logged_s < SETTLE_S,
                "busy_ms": {name: round(cpu_delta(first[name], before[name]) / 1e6)
                            for name in before}}


def batch_rate(port: int, token: str, workspace: str, items: int, chunk: int) -> dict[str, Any]:
    """Items/s of one client sending ``items`` fresh creates ``chunk`` a request."""
    client = Client(port, token)
    prefix = uuid.uuid4().hex[:8]
    failures: Counter[str] = Counter()
    started = time.perf_counter()
    for start in range(0, items, chunk):
        tasks = [{"external_id": f"{prefix}-{n}", "title": "bench"}
                 for n in range(start, min(start + chunk, items))]
        status, reply = client.request(
            "POST", "/api/v1/tasks/batch", {"workspace_id": workspace, "tasks": tasks}
        )
        if status != 200:
            failures[f"{status}:{(reply or {}).get('error')}"] += len(tasks)
            continue
        for result in reply["results"]:
            if result["outcome"] != "created":
                failures[result["outcome"]] += 1
    elapsed = time.perf_counter() - started
    return {"items_per_s": round(items / elapsed, 1), "seconds": round(elapsed, 2),
            "failed_items": dict(failures)}


def single_rate(port: int, token: str, workspace: uuid.UUID, clients: int,
                seconds: float) -> dict[str, Any]:
    failures: Counter[str] = Counter()
    calls, elapsed = concurrent_count(
        lambda: poster(port, token, lambda: body(workspace, f"S-{uuid.uuid4()}"), "created",
                       failures),
        clients, seconds,
    )
    return {"created_per_s": round(calls / elapsed, 1), "clients": clients,
            "failed_requests": dict(failures)}


def worker_rss_kb(server: Gunicorn) -> dict[int, int]:
    """Each worker's resident memory (kB), by pid."""
    children = Path(f"/proc/{server.process.pid}/task/{server.process.pid}/children")
    found = {}
    for pid in children.read_text().split():
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    found[int(pid)] = int(line.split()[1])
    return found


def rss_during_request(server: Gunicorn, token: str, workspace: str) -> dict[str, Any]:
    """The workers' RSS before one RSS_ITEMS-item batch and their peak while
    it runs (sampled every 10 ms)."""
    before = worker_rss_kb(server)
    peak = dict(before)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for pid, rss in worker_rss_kb(server).items():
                peak[pid] = max(peak.get(pid, 0), rss)
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        batch_rate(server.port, token, workspace, RSS_ITEMS, RSS_ITEMS)
    finally:
        done.set()
        sampler.join(timeout=5)
    grown = max((peak[pid] - before.get(pid, peak[pid]) for pid in peak), default=0)
    return {"items": RSS_ITEMS, "worker_rss_kb_before": sorted(before.values()),
            "worker_rss_kb_peak": sorted(peak.values()), "most_grown_kb": grown}


def measured_batch(settler: Settler, port: int, token: str, workspace: str, items: int,
                   chunk: int) -> dict[str, Any]:
    """``batch_rate`` from a settled start; then how long the work the batch
    left behind took (the ledger's hashing and signing of its events...): the
    items/s until the last answer (what the client sees, the targets' figure)
    and until that work was done too (``items_per_s_with_after``)."""
    settled = settler.wait()
    result = batch_rate(port, token, workspace, items, chunk)
    after = settler.wait()
    done_s = result["seconds"] + after["logged_s"]
    return {**result, "settle_before": settled, "after_answers": after,
            "items_per_s_with_after": round(items / done_s, 1)}


def measured_single(settler: Settler, port: int, token: str, workspace: uuid.UUID,
                    clients: int, seconds: float) -> dict[str, Any]:
    settled = settler.wait()
    return {**single_rate(port, token, workspace, clients, seconds), "settle_before": settled}


def one_round(
    order: list[str], servers: dict[str, Gunicorn], settler: Settler, tokens: dict[str, str],
    workspaces: dict[str, uuid.UUID], items: int, chunk: int, seconds: float,
) -> dict[str, Any]:
    """Each measurement from a settled start (Settler), the servers in ``order``."""
    row: dict[str, Any] = {"order": order, "load": load_average()}
    for side in order:
        port, token, workspace = servers[side].port, tokens[side], workspaces[side]
        row[side] = {
            "batch": measured_batch(settler, port, token, str(workspace), items, chunk),
            "single_1": measured_single(settler, port, token, workspace, 1, seconds),
            "single_16": measured_single(settler, port, token, workspace, PEER_CLIENTS,
                                         seconds),
        }
    row["load_after"] = load_average()
    return row


def batch_cost(
    side: str, server: Gunicorn, directory: Path, settler: Settler, token: str,
    workspace: str, items: int, chunk: int,
) -> dict[str, Any]:
    """CPU µs per item by component for one import of ``items`` (chunks of
    ``chunk``) from a settled start, as the scaling section's cost_per_created
    splits a create: the server's processes (/proc) split by the workers'
    samplers (scripts/cost_sampler.py, the batch route's boundaries added) and
    PostgreSQL's; the work left behind after the last answer (until settled,
    Settler) counted in, and also apart (``after_answers_us``)."""
    settler.wait()
    phase = f"{side}-bulk-{uuid.uuid4().hex[:6]}"
    set_phase(directory, phase)
    time.sleep(4 * 0.05)  # the workers poll the phase every 50 ms
    first = settler.readings()
    rate = batch_rate(server.port, token, workspace, items, chunk)
    answered = settler.readings()
    after = settler.wait()
    last = settler.at_settle
    set_phase(directory, "")
    timed_ns, _, _ = sampled(directory, phase, server.workers)
    per = 1e-3 / items  # µs per item of one ns
    master = server.process.pid
    sampled_pids = {int(path.stem) for path in directory.glob("*.json")}
    by_pid = {pid: (ns - first[side].get(pid, 0)) * per for pid, ns in last[side].items()}
    components = {name: ns * per for name, ns in timed_ns.items() if ":" not in name}
    workers_us = sum(us for pid, us in by_pid.items() if pid in sampled_pids)
    components[REST] = max(0.0, workers_us - sum(components.values()))
    components["gunicorn master"] = by_pid.get(master, 0.0)
    # The master's other children: a background process of the node's, if any.
    components["background process"] = sum(
        us for pid, us in by_pid.items() if pid != master and pid not in sampled_pids)
    components["postgres"] = cpu_delta(first["postgres"], last["postgres"]) * per
    rounded = {name: round(value, 1) for name, value in sorted(components.items())}
    return {
        "items": items, "chunk": chunk, "items_per_s": rate["items_per_s"],
        "failed_items": rate["failed_items"],
        "total_us": round(sum(components.values()), 1),
        "server_processes_us": round(sum(by_pid.values()), 1),
        "postgres_us": rounded["postgres"],
        "components_us": rounded,
        "after_answers_us": {
            "server": round(cpu_delta(answered[side], last[side]) * per, 1),
            "postgres": round(cpu_delta(answered["postgres"], last["postgres"]) * per, 1)},
        "after_answers": after,
    }


def servers_with_samplers(
    env: dict[str, str], peer_env: dict[str, str], workers: int, tmp: Path,
    stack: contextlib.ExitStack,
) -> tuple[dict[str, Gunicorn], dict[str, Path]]:
    """Both servers from http/gunicorn.conf.py run as is by the wrapper that
    adds the CPU sampler to post_fork (idle until a cost phase is named)."""
    config = tmp / "gunicorn-bulk-cost.conf.py"
    config.write_text(COST_CONFIG.format(
        config=str(REPO / "http" / "gunicorn.conf.py"), scripts=str(REPO / "scripts")))
    directories = {"kandev": tmp / "bulk-cost-kandev", "peer": tmp / "bulk-cost-peer"}
    for directory in directories.values():
        directory.mkdir()
    kandev = Gunicorn({**env, "BENCH_COST_DIR": str(directories["kandev"]),
                       "BENCH_COST_SIDE": "kandev-bulk"}, workers,
                      tmp / "gunicorn-bulk.log", config=config)
    stack.callback(kandev.stop)
    peer = Gunicorn({**peer_env, "BENCH_COST_DIR": str(directories["peer"]),
                     "BENCH_COST_SIDE": "peer-bulk"}, workers, tmp / "gunicorn-bulk-peer.log",
                    ("--pythonpath", str(REPO / "scripts"), "crud_peer:create_app()"),
                    config=config)
    stack.callback(peer.stop)
    return {"kandev": kandev, "peer": peer}, directories


def bulk_cost(
    services: Services, admin_url: str, url: str, schema: str, tmp: Path, workers: int,
    seconds: float, rounds: int, items: int = 10_000, chunk: int = 500,
) -> dict[str, Any]:
    env = environment(url, tmp / "data")
    db_init(env)
    peer_schema, peer_url = f"{schema}_bulk_peer", postgres_target(admin_url).conninfo
    peer = [sys.executable, str(REPO / "scripts" / "crud_peer.py")]
    subprocess.run([*peer, "init", peer_url, peer_schema], check=True, timeout=60,
                   stdin=subprocess.DEVNULL)
    workspace = services.workspaces.open("bench-bulk", "BLK")
    token, _ = services.tokens.issue(workspace_id=workspace.id, admin=False)
    peer_workspace = uuid.uuid4()
    peer_token = subprocess.run(
        [*peer, "token", peer_url, peer_schema, str(peer_workspace)], check=True, timeout=60,
        capture_output=True, text=True, stdin=subprocess.DEVNULL,
    ).stdout.strip()
    tokens = {"kandev": token, "peer": peer_token}
    workspaces = {"kandev": workspace.id, "peer": peer_workspace}
    peer_env = {**env, "PEER_DATABASE_URL": peer_url, "PEER_SCHEMA": peer_schema,
                "KANDEV_DATA_DIR": str(tmp / "bulk-peer-data")}
    rows = []
    with contextlib.ExitStack() as stack:
        servers, directories = servers_with_samplers(env, peer_env, workers, tmp, stack)
        settler = Settler(services, servers, PostgresSide(admin_url))
        for number in range(rounds):
            order = ["kandev", "peer"] if number % 2 == 0 else ["peer", "kandev"]
            say(f"bulk round {number + 1}/{rounds}: {', '.join(order)}, {items} items")
            rows.append(one_round(order, servers, settler, tokens, workspaces, items, chunk,
                                  seconds))
        say(f"bulk: CPU per item, {items} items each side")
        cost = {side: batch_cost(side, servers[side], directories[side], settler, tokens[side],
                                 str(workspaces[side]), items, chunk)
                for side in ("kandev", "peer")}
        settler.wait()
        rss = rss_during_request(servers["kandev"], token, str(workspace.id))
    return {**summary(rows, workers, items, chunk, rss), "cost_per_item": cost,
            "settle": {"window_s": QUIET_S, "idle_ms": round(settler.idle_ns / 1e6, 1),
                       "quiet_ms": round(settler.quiet_ns / 1e6, 1)},
            "load_after": load_average()}


def summary(rows: list[dict[str, Any]], workers: int, items: int, chunk: int,
            rss: dict[str, Any]) -> dict[str, Any]:
    def median(side: str, part: str, key: str) -> float:
        return round(statistics.median(row[side][part][key] for row in rows), 1)

    batch = median("kandev", "batch", "items_per_s")
    own_single = median("kandev", "single_1", "created_per_s")
    peer_single = median("peer", "single_16", "created_per_s")
    peer_batch = median("peer", "batch", "items_per_s")

    def over(baseline: float) -> float:
        return round(batch / baseline, 3) if baseline else 0.0

    return {
        "workers": workers, "items": items, "chunk": chunk, "rounds": rows,
        "kandev_batch_items_per_s": batch,
        "kandev_batch_items_per_s_with_after": median("kandev", "batch", "items_per_s_with_after"),
        "peer_batch_items_per_s_with_after": median("peer", "batch", "items_per_s_with_after"),
        "kandev_single_1_client_per_s": own_single,
        "kandev_single_16_clients_per_s": median("kandev", "single_16", "created_per_s"),
        "peer_single_16_clients_per_s": peer_single,
        "peer_batch_items_per_s": peer_batch,
        "batch_vs_peer_single_16": over(peer_single),
        "batch_vs_own_single_1": over(own_single),
        "batch_vs_peer_batch": over(peer_batch),
        "rss_during_1000_item_request": rss,
        "targets": {
            "batch_ge_2x_peer_single_16": over(peer_single) >= 2.0,
            "batch_ge_5x_own_single_1": over(own_single) >= 5.0,
            "batch_ge_0_3x_peer_batch": over(peer_batch) >= 0.3,
        },
    }
