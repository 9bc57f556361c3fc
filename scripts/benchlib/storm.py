"""The storm: 64 clients create one external ID at once; exactly one task."""

from __future__ import annotations

import http.client
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchlib.common import WAIT_S, body
from benchlib.server import Client, Gunicorn
from kandev_es.bootstrap import Services

STORM_CLIENTS = 64


def storm(server: Gunicorn, token: str, services: Services) -> dict[str, Any]:
    """64 clients, one external ID, released at once by a barrier."""
    workspace = services.workspaces.open("bench-storm", "STM")
    payload = body(workspace.id, "STORM-1", "storm")
    clients = [Client(server.port, token) for _ in range(STORM_CLIENTS)]
    for client in clients:
        client.conn.connect()
    barrier = threading.Barrier(STORM_CLIENTS)

    def fire(client: Client) -> str:
        barrier.wait(timeout=WAIT_S)
        try:
            status, reply = client.request("POST", "/api/v1/tasks", payload)
        except (OSError, http.client.HTTPException) as error:
            return type(error).__name__
        return str(reply.get("outcome")) if status == 200 else f"http_{status}"

    with ThreadPoolExecutor(STORM_CLIENTS) as pool:
        outcomes = Counter(pool.map(fire, clients))
    services.projections.catch_up()
    with services.database.transaction() as tx:
        [(rows,)] = tx.execute(
            "SELECT count(*) FROM tasks_view WHERE workspace_id = ?", (str(workspace.id),)
        )
    return {
        "clients": STORM_CLIENTS,
        "outcomes": dict(outcomes),
        "tasks_created": int(rows),
        "target_tasks": 1,
        "met": int(rows) == 1 and outcomes.get("created") == 1,
    }
