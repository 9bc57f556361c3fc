"""scripts/bench in its short form: one JSON object with every measurement, and
the 64-client same-ID storm makes exactly one task. No timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import postgres_admin_url

# Each run of scripts/bench may take its own 300 s subprocess timeout.
pytestmark = pytest.mark.timeout(420)

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench"


def bench(*args: str) -> tuple[dict, str]:
    """scripts/bench with ``args`` on a schema of its own in the test PostgreSQL
    (no KANDEV_* of this process leaks in): its JSON report and its stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KANDEV_")}
    env["KANDEV_BENCH_DATABASE_URL"] = postgres_admin_url()
    run = subprocess.run(
        [sys.executable, str(BENCH), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    report: dict = json.loads(run.stdout)
    return report, run.stderr


def test_quick_bench_prints_every_measurement_and_a_single_storm_task():
    report, _ = bench("--quick", "--seconds", "0.5")

    for side in ("in_process", "http"):
        assert {
            "found_per_s", "raw_select_per_s", "found_ratio",
            "created_per_s", "raw_insert_tx_per_s", "created_ratio",
        } <= report[side].keys()
        assert report[side]["found_per_s"] > 0 and report[side]["created_per_s"] > 0
    assert report["http"]["failed_requests"] == {}
    assert {"commits_per_creation", "write_transactions_per_found"} <= report[
        "transactions"
    ].keys()
    assert report["storm"]["tasks_created"] == 1
    assert report["storm"]["outcomes"]["created"] == 1
    assert sum(report["storm"]["outcomes"].values()) == 64
    assert report["projection_lag"]["missing"] == 0
    assert {"p50_ms", "p99_ms"} <= report["projection_lag"].keys()
    assert report["rebuild"]["events_per_s"] > 0
    assert "crash_to_found_settled_s" in report["recovery"], report["recovery"]
    assert report["recovery"]["runtime_runs"] >= 1  # the Runtime, not the owner, settled it
    assert report["database"]["fsync"] in ("on", "off")  # printed beside the ratios
    assert report["targets"]["storm_tasks"]["met"] is True
    assert {"found_in_process_vs_raw_select", "created_in_process_vs_raw_insert_tx"} <= report[
        "targets"
    ].keys()


def test_scaling_section_compares_kandev_with_the_crud_peer_at_each_client_count():
    """scripts/bench --scaling-only with tiny sizes: kandev-es and
    scripts/crud_peer.py served side by side on the test PostgreSQL; the JSON
    holds a kandev/peer ratio per client count. No timing is asserted."""
    report, stderr = bench(
        "--scaling-only", "--seconds", "0.3", "--workers", "1",
        "--scaling-clients", "1,2", "--save-clients", "1,2", "--cost-clients", "0",
    )
    scaling = report["scaling"]
    assert [row["clients"] for row in scaling["http"]] == [1, 2]
    for row in scaling["http"]:
        assert {"created_ratio", "found_ratio"} <= row.keys()
        for side in ("kandev", "peer"):
            assert row[f"{side}_created_per_s"] > 0 and row[f"{side}_found_per_s"] > 0
    assert scaling["failed_requests"] == {"kandev": {}, "peer": {}}
    assert "x peer" in stderr  # the ratios are printed
    assert [row["clients"] for row in scaling["store_saves"]] == [1, 2]
    for row in scaling["store_saves"]:
        assert {"saves_per_s", "raw_insert_tx_per_s", "ratio", "vs_one_client"} <= row.keys()
        assert row["saves_per_s"] > 0 and row["raw_insert_tx_per_s"] > 0
    # Targets are judged only at the counts measured: none over HTTP below 16 clients.
    assert set(scaling["targets"]) == {"saves_vs_raw_at_2", "saves_at_2_vs_one_client"}


def test_cost_tables_split_each_request_s_cpu_by_component_for_kandev_and_the_peer():
    """scripts/bench --scaling-only with a tiny cost load: cost_per_created and
    cost_per_found hold, for kandev-es and the CRUD peer alike, CPU µs per
    request by component (server processes by boundary, PostgreSQL's own),
    every figure non-negative and summing to the total, plus commits per
    request; both served by the same worker class, threads and workers, every
    timed boundary still found in the code. No timing is asserted."""
    report, stderr = bench(
        "--scaling-only", "--seconds", "0.5", "--workers", "1",
        "--scaling-clients", "1", "--save-clients", "1",
        "--cost-clients", "2", "--cost-settle", "0",
    )
    scaling = report["scaling"]
    kandev_parts = {
        "HTTP server and the rest", "Flask + API", "auth", "reads",
        "creation and event building", "event encoding", "save statement (+NOTIFY)",
        "office number", "projection runner", "projection tasks", "projection creations",
        "projection identities", "projection feeds", "gunicorn master", "postgres",
    }
    for table in ("cost_per_created", "cost_per_found"):
        [row] = scaling[table]
        assert row["clients"] == 2
        for side in ("kandev", "peer"):
            cost = row[side]
            assert cost["requests"] > 0 and cost["failed_requests"] == {}
            parts = cost["components_us"]
            assert kandev_parts <= parts.keys()
            assert all(value >= 0 for value in parts.values()), parts
            assert abs(sum(parts.values()) - cost["total_us"]) <= 0.1, parts
            assert cost["total_us"] > 0
            assert cost["postgres_us"] is not None and cost["postgres_us"] >= 0
            assert cost["commits_per_op"] >= 0 and cost["write_transactions_per_op"] >= 0
            assert {"waited_per_op", "wait_ms_per_op", "checkouts_per_op"} <= cost["pool"].keys()
            # where the time (not only the CPU) goes: waiting shows beside it
            assert {"Flask + API", "auth", "reads"} <= cost["wall_ms_per_op"].keys()
            assert all(value >= 0 for value in cost["wall_ms_per_op"].values())
            assert cost["app_ms_per_op"] > 0 and cost["latency_ms"] > 0
    # A Created writes: the save is measured on both sides.
    created = scaling["cost_per_created"][0]
    for side in ("kandev", "peer"):
        assert created[side]["components_us"]["save statement (+NOTIFY)"] > 0
        assert created[side]["write_transactions_per_op"] > 0
    servers = scaling["servers"]
    assert servers["same"] is True
    assert servers["kandev"]["worker_class"] == servers["peer"]["worker_class"]
    assert servers["kandev"]["threads"] == servers["peer"]["threads"]
    assert servers["kandev"]["not_wrapped"] == [] and servers["peer"]["not_wrapped"] == []
    assert "cost:" in stderr
