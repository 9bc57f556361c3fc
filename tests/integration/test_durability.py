"""Durability is visible (docs/operations.md "High availability"): on PostgreSQL,
/readyz says whether a commit waits for a synchronous standby, as the primary
reports it. The suite's server is one node with ``synchronous_commit=off``: not
durable, and it says why. (The formation case, a synchronous standby and
``durable: true``, is in tests/chaos/test_failover.py.)"""

from __future__ import annotations

from typing import Any

from kandev_es.storage.durability import durability


def test_readyz_says_whether_commits_wait_for_a_synchronous_standby(client: Any,
                                                                       services: Any) -> None:
    ready = client.get("/readyz")
    assert ready.status_code == 200
    if services.database.backend == "sqlite":
        assert "durability" not in ready.json
        return
    assert ready.json["durability"] == {
        "synchronous_commit": "off",
        "synchronous_standby_names": "",
        "synchronous_standbys": 0,
        "durable": False,
    }
    found = durability(services.database)
    assert found is not None
    assert found.describe().startswith("NOT durable (synchronous_commit=off)")
