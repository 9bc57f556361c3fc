"""The embedded default holds a storm (AC-1 under load): on `kandev-es serve`
with SQLite, 64 clients creating one external id at once and 64 creating
distinct ids at once get no 503 and no timeout (30 s client timeout), and
exactly one task per id. Latency is printed by scripts/storm, not asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.served import ServedProcess

STORM = Path(__file__).resolve().parents[2] / "scripts" / "storm"


@pytest.fixture
def server(settings, tmp_path):
    if settings.database_url:
        pytest.skip("SQLite embedded default only")
    served = ServedProcess(settings, tmp_path)
    yield served
    served.stop()


@pytest.mark.timeout(420)  # its storm subprocess has a 300 s timeout of its own
def test_64_client_storm_and_burst_on_sqlite(server):
    run = subprocess.run(
        [sys.executable, str(STORM), "--base", server.base, "--token", str(server.token),
         "--workspace", server.workspace_id, "--clients", "64"],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    print(report)
    storm, burst = report["same_id_storm"], report["distinct_burst"]
    assert storm["statuses"] == {"200": 64}, (storm, server.log())
    assert burst["statuses"] == {"200": 64}, (burst, server.log())
    assert storm["distinct_task_ids"] == 1
    assert burst["distinct_task_ids"] == 64
