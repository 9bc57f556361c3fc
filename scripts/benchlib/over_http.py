"""Over HTTP: found and created through gunicorn against raw baselines on
as many connections, then the storm and the projection lag on the same server."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from benchlib.common import body, concurrent_rate, ratio, say
from benchlib.database import connect, prepare_raw_key, raw_insert_tx, raw_select
from benchlib.lag import projection_lag
from benchlib.server import Client, Gunicorn, db_init, environment, poster
from benchlib.storm import storm
from kandev_es.bootstrap import Services
from kandev_es.config import Settings


def over_http(
    server: Gunicorn, token: str, workspace: uuid.UUID, url: str, schema: str,
    clients: int, seconds: float,
) -> dict[str, Any]:
    held = body(workspace, "HTTP-FOUND-1")
    status, reply = Client(server.port, token).request("POST", "/api/v1/tasks", held)
    assert status == 200 and reply["outcome"] == "created", (status, reply)
    failures: Counter[str] = Counter()

    found = concurrent_rate(
        lambda: poster(server.port, token, lambda: held, "found_settled", failures),
        clients, seconds,
    )
    created = concurrent_rate(
        lambda: poster(server.port, token, lambda: body(workspace, f"HTTP-{uuid.uuid4()}"),
                       "created", failures),
        clients, seconds,
    )
    key = prepare_raw_key(url, schema)
    connections: list[psycopg.Connection[Any]] = []

    def raw(kind: str) -> Callable[[], None]:
        conn = connect(url, schema)
        connections.append(conn)
        return raw_select(conn, key) if kind == "select" else raw_insert_tx(conn)

    try:
        raw_found = concurrent_rate(lambda: raw("select"), clients, seconds)
        raw_created = concurrent_rate(lambda: raw("insert"), clients, seconds)
    finally:
        for conn in connections:
            conn.close()
    return {
        "clients": clients,
        "found_per_s": round(found, 1),
        "raw_select_per_s": round(raw_found, 1),
        "found_ratio": ratio(found, raw_found),
        "created_per_s": round(created, 1),
        "raw_insert_tx_per_s": round(raw_created, 1),
        "created_ratio": ratio(created, raw_created),
        "failed_requests": dict(failures),
    }


def served(
    settings: Settings, url: str, schema: str, tmp: Path, services: Services,
    seconds: float, workers: int, clients: int, samples: int,
) -> dict[str, Any]:
    env = environment(url, tmp / "data")
    db_init(env)
    workspace = services.workspaces.open("bench-http", "BHT")
    token, _ = services.tokens.issue(workspace_id=workspace.id, admin=False)
    admin, _ = services.tokens.issue(workspace_id=None, admin=True)
    say(f"gunicorn, {workers} workers, {clients} clients")
    server = Gunicorn(env, workers, tmp / "gunicorn.log")
    try:
        result: dict[str, Any] = {"http": {"workers": workers, **over_http(
            server, token, workspace.id, url, schema, clients, seconds)}}
        say("64-client storm")
        result["storm"] = storm(server, admin, services)
        say("projection lag")
        result["projection_lag"] = projection_lag(
            server, token, workspace.id, url, schema, max(10, samples // 2)
        )
    finally:
        server.stop()
    return result
