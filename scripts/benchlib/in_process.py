"""In-process: found and created through bootstrap(...).creation.create (one
caller) against a raw SELECT / INSERT transaction, and commits per create."""

from __future__ import annotations

import uuid
from typing import Any

from benchlib.common import body, rate, ratio
from benchlib.database import connect, counters, prepare_raw, raw_insert_tx, raw_select
from kandev_es.bootstrap import Services, bootstrap
from kandev_es.config import Settings


def in_process(services: Services, url: str, schema: str, seconds: float) -> dict[str, Any]:
    workspace = services.workspaces.open("bench-in-process", "BIP")
    _, principal = services.tokens.issue(workspace_id=workspace.id, admin=False)
    held = body(workspace.id, "FOUND-1")
    assert services.creation.create(principal, held).outcome.value == "created"

    def found() -> None:
        result = services.creation.create(principal, held)
        assert result.outcome.value == "found_settled", result.outcome

    def created() -> None:
        result = services.creation.create(principal, body(workspace.id, f"NEW-{uuid.uuid4()}"))
        assert result.outcome.value == "created", result.outcome

    key = prepare_raw(url, schema)
    with connect(url, schema) as conn:
        raw_found = rate(raw_select(conn, key), seconds)
        raw_created = rate(raw_insert_tx(conn), seconds)
    found_rate = rate(found, seconds)
    created_rate = rate(created, seconds)
    return {
        "found_per_s": round(found_rate, 1),
        "raw_select_per_s": round(raw_found, 1),
        "found_ratio": ratio(found_rate, raw_found),
        "created_per_s": round(created_rate, 1),
        "raw_insert_tx_per_s": round(raw_created, 1),
        "created_ratio": ratio(created_rate, raw_created),
    }


def transactions_per_call(settings: Settings, calls: int, found: bool) -> tuple[float, float]:
    """Commits and write transactions per create, differencing a run of ``calls``
    creates against an otherwise identical run of none (bootstrap and pool
    traffic cancel out). PostgreSQL flushes a backend's counters when it exits,
    hence a fresh Services per run, closed before reading."""

    def run(n: int) -> tuple[int, int]:
        before = counters(settings.database_url or "")
        services = bootstrap(settings.with_overrides(create_tables=False))
        try:
            workspace = services.workspaces.open(f"bench-tx-{uuid.uuid4().hex[:8]}", "BTX")
            _, principal = services.tokens.issue(workspace_id=workspace.id, admin=False)
            held = body(workspace.id, "HELD")
            services.creation.create(principal, held)
            for _ in range(n):
                services.creation.create(
                    principal, held if found else body(workspace.id, f"TX-{uuid.uuid4()}")
                )
        finally:
            services.close()
        after = counters(settings.database_url or "")
        return after[0] - before[0], after[1] - before[1]

    empty, full = run(0), run(calls)
    return (full[0] - empty[0]) / calls, (full[1] - empty[1]) / calls


def transactions(settings: Settings, samples: int) -> dict[str, Any]:
    """Commits and write transactions per creation and per found, ``samples`` each."""
    commits, writes = transactions_per_call(settings, samples, found=False)
    found_commits, found_writes = transactions_per_call(settings, samples, True)
    return {
        "commits_per_creation": round(commits, 2),
        "write_transactions_per_creation": round(writes, 2),
        "commits_per_found": round(found_commits, 2),
        "write_transactions_per_found": round(found_writes, 2),
        "note": "commits = pg_stat_database.xact_commit (read-only "
        "statements count too); write transactions = xids assigned",
    }
