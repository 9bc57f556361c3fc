"""The 'webhooks' section (docs/webhooks.md; issue 45's benchmark): Created
over HTTP at ``clients`` on ``workers``, served afresh per variant, with no
webhook subscription ("off") and with one to a fast local receiver ("on":
the deliverer in the workers' background, as `serve` runs it), the variants
alternating which goes first per round. For "on": each task's lag from the
create's acknowledgement to the receiver getting its task.created (it answers
204 at once), and how many never came. Ratios are taken within a round, so
other work on the machine moves both sides alike."""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from benchlib.common import body, concurrent_count, load_average, percentile, say
from benchlib.server import Client, Gunicorn, environment
from kandev_es.bootstrap import Services
from kandev_es.webhooks import Webhooks

DRAIN_S = 60.0  # how long the receiver may take to get every event after the load


class FastReceiver:
    """Answers 204 at once; keeps when each task's task.created arrived."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body leave as written

            def do_POST(self) -> None:  # http.server's name
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                now = time.perf_counter()
                task = json.loads(raw)["subject"]
                with receiver._lock:
                    receiver.requests += 1
                    receiver.arrived.setdefault(task, now)
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def acked_poster(
    port: int, token: str, workspace: uuid.UUID, acked: dict[str, float], failures: Counter[str]
) -> Callable[[], None]:
    """One client: POST a fresh create; keep its task's acknowledgement time."""
    client = Client(port, token)

    def run() -> None:
        try:
            status, reply = client.request("POST", "/api/v1/tasks", body(workspace, None))
        except (OSError, http.client.HTTPException) as error:
            failures[type(error).__name__] += 1
            return
        if status != 200 or reply.get("outcome") != "created":
            failures[f"{status}:{(reply or {}).get('error')}"] += 1
            return
        acked[reply["id"]] = time.perf_counter()

    return run


def one_variant(
    env: dict[str, str],
    workers: int,
    clients: int,
    seconds: float,
    token: str,
    workspace: uuid.UUID,
    log: Path,
    receiver: FastReceiver | None,
) -> dict[str, Any]:
    server = Gunicorn(env, workers, log)
    acked: dict[str, float] = {}
    failures: Counter[str] = Counter()
    try:
        count, elapsed = concurrent_count(
            lambda: acked_poster(server.port, token, workspace, acked, failures),
            clients,
            seconds,
        )
        result: dict[str, Any] = {
            "created_per_s": round(count / elapsed, 1),
            "failed_requests": dict(failures),
        }
        if receiver is not None:
            result.update(_lags(acked, receiver))
    finally:
        server.stop()
    return result


def _lags(acked: dict[str, float], receiver: FastReceiver) -> dict[str, Any]:
    deadline = time.monotonic() + DRAIN_S
    while time.monotonic() < deadline and not set(acked) <= set(receiver.arrived):
        time.sleep(0.05)
    lags = [(receiver.arrived[t] - at) * 1000 for t, at in acked.items() if t in receiver.arrived]
    missing = sum(1 for t in acked if t not in receiver.arrived)
    start = min(acked.values(), default=0.0)
    by_second: dict[int, list[float]] = {}
    for task, at in acked.items():
        if task in receiver.arrived:
            by_second.setdefault(int(at - start), []).append((receiver.arrived[task] - at) * 1000)
    return {
        # the median lag of the tasks acknowledged in each second of the load:
        # rising, the deliverer falls behind; falling, it started late
        "lag_ms_p50_by_second": [
            round(percentile(by_second[n], 0.5), 1) for n in sorted(by_second)
        ],
        "delivered": len(lags),
        "missing": missing,
        "requests": receiver.requests,
        "lag_ms_p50": round(percentile(lags, 0.5), 1) if lags else None,
        "lag_ms_p99": round(percentile(lags, 0.99), 1) if lags else None,
        "lag_ms_max": round(max(lags), 1) if lags else None,
    }


def webhooks_cost(
    services: Services, url: str, tmp: Path, workers: int, clients: int, seconds: float, rounds: int
) -> dict[str, Any]:
    workspace = services.workspaces.open("bench-webhooks", "BWH")
    token, _ = services.tokens.issue(workspace_id=workspace.id, admin=False)
    env = environment(
        url,
        tmp / "data",
        KANDEV_WEBHOOK_ALLOW_HTTP="true",
        KANDEV_WEBHOOK_ALLOW_NETWORKS="127.0.0.0/8",
    )
    allowed = services.settings.with_overrides(
        webhook_allow_http=True, webhook_allow_networks=("127.0.0.0/8",)
    )
    hooks = Webhooks.build(allowed, services.app, services.database).service
    rows: list[dict[str, Any]] = []
    for number in range(rounds):
        order = ["off", "on"] if number % 2 == 0 else ["on", "off"]
        say(f"webhooks round {number + 1}/{rounds}: {', '.join(order)}")
        row: dict[str, Any] = {"order": order, "load": load_average()}
        for name in order:
            receiver = FastReceiver() if name == "on" else None
            made = None
            if receiver is not None:
                made, _ = hooks.create(workspace.id, receiver.url, ["task.created"])
            try:
                row[name] = one_variant(
                    env,
                    workers,
                    clients,
                    seconds,
                    token,
                    workspace.id,
                    tmp / f"webhooks-{name}-{number}.log",
                    receiver,
                )
            finally:
                if made is not None:
                    hooks.delete(workspace.id, uuid.UUID(made["id"]))
                if receiver is not None:
                    receiver.close()
        row["load_after"] = load_average()
        rows.append(row)
    return _summary(rows, workers, clients)


def _summary(rows: list[dict[str, Any]], workers: int, clients: int) -> dict[str, Any]:
    ratios = [
        round(r["on"]["created_per_s"] / r["off"]["created_per_s"], 3)
        if r["off"]["created_per_s"]
        else 0.0
        for r in rows
    ]
    p99s = [r["on"]["lag_ms_p99"] for r in rows if r["on"]["lag_ms_p99"] is not None]
    missing = sum(r["on"]["missing"] for r in rows)
    ratio = statistics.median(ratios)
    p99 = statistics.median(p99s) if p99s else None
    return {
        "workers": workers,
        "clients": clients,
        "rounds": rows,
        "created_per_s_ratio_on_to_off": ratios,
        "median_ratio_on_to_off": round(ratio, 3),
        "median_lag_ms_p99": p99,
        "missing": missing,
        "targets": {
            "lag_p99_le_1s": p99 is not None and p99 <= 1000 and missing == 0,
            "cost_le_10_percent": ratio >= 0.9,
        },
    }
