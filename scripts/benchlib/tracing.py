"""What traces cost (docs/observability.md: Cost): creates over HTTP on the
same code with tracing off and on (OTLP/HTTP to a sink in the bench that
accepts and discards), and optionally an earlier checkout (``--before REPO``:
its own .venv and http/gunicorn.conf.py) with tracing off, each started afresh
per round, the variants alternating which goes first. Per variant: creates/s
and the servers' CPU ms per Created (master and workers, /proc), medians over
the rounds, and the per-round ratios to ``off`` (so a machine busy with other
work moves both sides of a ratio alike)."""

from __future__ import annotations

import statistics
import threading
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from benchlib.common import body, concurrent_count, load_average, say
from benchlib.cpu import PostgresSide, cpu_delta, family_cpu
from benchlib.server import Gunicorn, environment, poster
from kandev_es.bootstrap import Services


class Sink:
    """An OTLP/HTTP endpoint that takes every export and keeps only counts."""

    def __init__(self) -> None:
        self.exports = 0
        self.bytes = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name
                size = int(self.headers.get("Content-Length", 0))
                sink.bytes += len(self.rfile.read(size))
                sink.exports += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def served_creates(
    variant: str, env: dict[str, str], before: Path | None, workers: int, clients: int,
    seconds: float, token: str, workspace: uuid.UUID, log: Path,
    postgres: PostgresSide | None = None,
) -> dict[str, Any]:
    """One variant, served afresh: creates/s and server CPU ms per Created
    (and PostgreSQL's, given ``postgres`` on this machine)."""
    python_and_config: dict[str, Any] = {}
    if variant == "before" and before is not None:
        python_and_config = {"python": str(before / ".venv" / "bin" / "python"),
                             "config": before / "http" / "gunicorn.conf.py", "cwd": before}
    server = Gunicorn(env, workers, log, **python_and_config)
    failures: Counter[str] = Counter()
    try:
        make = lambda: poster(  # noqa: E731 -- one client's call
            server.port, token, lambda: body(workspace, f"TR-{uuid.uuid4()}"), "created",
            failures)
        started: dict[str, Any] = {}
        pg_cpu = postgres.cpu if postgres is not None else lambda: None
        count, elapsed = concurrent_count(
            make, clients, seconds,
            started_hook=lambda: started.update(cpu=family_cpu(server.process.pid),
                                                pg=pg_cpu()),
            stopped_hook=lambda: started.update(
                spent=cpu_delta(started["cpu"], family_cpu(server.process.pid)),
                pg_spent=None if started["pg"] is None else cpu_delta(started["pg"], pg_cpu())),
        )
    finally:
        server.stop()
    result = {
        "created_per_s": round(count / elapsed, 1),
        "cpu_ms_per_created": round(started["spent"] / 1e6 / max(count, 1), 3),
        "failed": dict(failures),
    }
    if started["pg_spent"] is not None:
        result["pg_cpu_ms_per_created"] = round(started["pg_spent"] / 1e6 / max(count, 1), 3)
    return result


def tracing_cost(
    services: Services, url: str, tmp: Path, workers: int, clients: int, seconds: float,
    rounds: int, before: Path | None,
) -> dict[str, Any]:
    workspace = services.workspaces.open("bench-tracing", "BTR")
    token, _ = services.tokens.issue(workspace_id=workspace.id, admin=False)
    sink = Sink()
    env = environment(url, tmp / "data")
    envs = {"off": env, "on": {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url}}
    if before is not None:
        envs["before"] = env
    names = list(envs)
    rows: list[dict[str, Any]] = []
    try:
        for number in range(rounds):
            order = names[number % len(names):] + names[: number % len(names)]
            say(f"tracing round {number + 1}/{rounds}: {', '.join(order)}")
            row: dict[str, Any] = {"order": order, "load": load_average()}
            for name in order:
                row[name] = served_creates(name, envs[name], before, workers, clients,
                                           seconds, token, workspace.id,
                                           tmp / f"tracing-{name}-{number}.log")
            rows.append(row)
    finally:
        sink.close()
    return _summary(rows, names, sink, workers, clients)


def _summary(
    rows: list[dict[str, Any]], names: list[str], sink: Sink, workers: int, clients: int
) -> dict[str, Any]:
    def median(name: str, key: str) -> float:
        return round(statistics.median(row[name][key] for row in rows), 3)

    def ratio(name: str, key: str) -> list[float]:
        return [round(row[name][key] / row["off"][key], 3) if row["off"][key] else 0.0
                for row in rows]

    summary: dict[str, Any] = {"workers": workers, "clients": clients, "rounds": rows,
                               "otlp_exports": sink.exports, "otlp_bytes": sink.bytes}
    for name in names:
        summary[name] = {key: median(name, key) for key in ("created_per_s", "cpu_ms_per_created")}
        if name != "off":
            summary[name]["created_per_s_ratio_to_off"] = ratio(name, "created_per_s")
            summary[name]["cpu_per_created_ratio_to_off"] = ratio(name, "cpu_ms_per_created")
    return summary
