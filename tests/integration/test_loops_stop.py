"""A background loop's stop returns only once the loop has ended, so the
store closed right after it is never closed under a pass still running (a
SQLite connection used after its close crashes the interpreter: two pytest
workers died so, as in-process MCP servers closed their services)."""

from __future__ import annotations

import time
from typing import Any


def test_each_loop_has_ended_when_its_stop_returns(services: Any, client: Any, member: Any) -> None:
    from tests.integration.helpers import create

    loops = {
        "projections": (services.projections, services.projections.start_thread(0.01)),
        "ledger": (services.ledger, services.ledger.start_thread()),
        "webhooks": (services.webhooks.deliverer(), services.webhooks.deliverer().start_thread()),
    }
    for n in range(5):  # work for the loops to be busy with
        assert create(client, member[1], external_id=f"LOOP-{n}", title="loop").status_code == 200
    time.sleep(0.05)
    for name, (owner, thread) in loops.items():
        assert thread.is_alive(), name
        owner.stop()
        assert not thread.is_alive(), f"{name}: its stop returned while the loop still ran"
