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
from benchlib.server import Client, Gunicorn, db_init, environment, poster
from kandev_es.bootstrap import Services
from kandev_es.config import postgres_target

PEER_CLIENTS = 16
RSS_ITEMS = 1_000


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


def one_round(
    order: list[str], kandev: Gunicorn, peer: Gunicorn, tokens: dict[str, str],
    workspaces: dict[str, uuid.UUID], items: int, chunk: int, seconds: float,
) -> dict[str, Any]:
    row: dict[str, Any] = {"order": order, "load": load_average()}
    for side in order:
        server = kandev if side == "kandev" else peer
        token, workspace = tokens[side], workspaces[side]
        row[side] = {
            "batch": batch_rate(server.port, token, str(workspace), items, chunk),
            "single_1": single_rate(server.port, token, workspace, 1, seconds),
            "single_16": single_rate(server.port, token, workspace, PEER_CLIENTS, seconds),
        }
    row["load_after"] = load_average()
    return row


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
    with contextlib.ExitStack() as servers:
        kandev = Gunicorn(env, workers, tmp / "gunicorn-bulk.log")
        servers.callback(kandev.stop)
        peer_server = Gunicorn(peer_env, workers, tmp / "gunicorn-bulk-peer.log",
                               ("--pythonpath", str(REPO / "scripts"), "crud_peer:create_app()"))
        servers.callback(peer_server.stop)
        for number in range(rounds):
            order = ["kandev", "peer"] if number % 2 == 0 else ["peer", "kandev"]
            say(f"bulk round {number + 1}/{rounds}: {', '.join(order)}, {items} items")
            rows.append(one_round(order, kandev, peer_server, tokens, workspaces, items, chunk,
                                  seconds))
        rss = rss_during_request(kandev, token, str(workspace.id))
    return summary(rows, workers, items, chunk, rss)


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
