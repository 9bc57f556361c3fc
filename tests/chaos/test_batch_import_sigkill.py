"""SIGKILL of the server in the middle of a 10,000-item import, then the same
import again (issue 44 point 7), on PostgreSQL: exactly one task per external
ID, no office number used twice, every creation settled, and `audit verify
--ledger` clean. The import is `kandev-es task import --url` against a real
served process; the kill takes the whole process group (master and worker)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from kandev_es.bootstrap import bootstrap
from tests.support.served import ServedProcess, environment, kandev_command

pytestmark = [pytest.mark.postgres_only, pytest.mark.slow]

ITEMS = 10_000
KILL_AFTER = 2_500  # created items seen in the store before the kill


def import_command(source: Path, report: Path, served: ServedProcess) -> list[str]:
    return [
        *kandev_command(),
        "task",
        "import",
        str(source),
        "--workspace",
        served.workspace_id,
        "--url",
        served.base,
        "--chunk-size",
        "500",
        "--report",
        str(report),
    ]


def wait_for_events(services, before: int, events: int, importer, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while services.app.max_notification_id() - before < events:
        assert importer.poll() is None, "the import ended before the kill"
        assert time.monotonic() < deadline, "the import made too little progress"
        time.sleep(0.05)


def test_sigkill_mid_import_then_the_same_import_makes_one_task_per_id(settings, tmp_path):
    source = tmp_path / "backlog.jsonl"
    source.write_text(
        "".join(
            json.dumps({"external_id": f"SYNC-{n}", "title": f"issue {n}"}) + "\n"
            for n in range(ITEMS)
        )
    )
    served = ServedProcess(settings, tmp_path, workers=1)
    token, port = served.token or "", served.port
    services = bootstrap(settings.with_overrides(runtime_in_process=False))
    env = environment(settings, KANDEV_TOKEN=token)
    try:
        before = services.app.max_notification_id()
        first_report = tmp_path / "first.jsonl"
        importer = subprocess.Popen(
            import_command(source, first_report, served),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_for_events(services, before, 4 * KILL_AFTER, importer)
        os.killpg(served.process.pid, signal.SIGKILL)  # master and worker, mid-batch
        served.process.wait(timeout=30)
        os.killpg(importer.pid, signal.SIGKILL)  # it would only retry a dead server
        importer.wait(timeout=30)
        partial = services.app.max_notification_id() - before
        assert 4 * KILL_AFTER <= partial < 4 * ITEMS, partial

        served = ServedProcess(settings, tmp_path, workers=1, port=port)
        report = tmp_path / "second.jsonl"
        again = subprocess.run(
            import_command(source, report, served),
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert again.returncode == 0, again.stdout + again.stderr
        entries = [json.loads(line) for line in report.read_text().splitlines()]
        outcomes = {entry["outcome"] for entry in entries}
        assert outcomes <= {"created", "found_settled"}, outcomes  # every creation settled
        found = sum(entry["outcome"] == "found_settled" for entry in entries)
        assert found >= KILL_AFTER
        assert len({entry["task_id"] for entry in entries}) == ITEMS
        assert len({entry["identifier"] for entry in entries}) == ITEMS  # no number reused
        services.projections.catch_up()
        listed, after = [], 0
        while True:
            page = services.tasks.list(uuid.UUID(served.workspace_id), after=after, limit=500)
            listed.extend(page.items)
            if page.next_cursor is None:
                break
            after = page.next_cursor
        assert len(listed) == ITEMS
        assert len({task["external_id"] for task in listed}) == ITEMS
        assert len({task["identifier"] for task in listed}) == ITEMS
        assert_ledger_verifies(settings)
    finally:
        services.close()
        served.stop()


def assert_ledger_verifies(settings, seconds: float = 120) -> None:
    """`audit verify --ledger` exits 0 once the sequencer has logged every event."""
    deadline = time.monotonic() + seconds
    while True:
        verified = subprocess.run(
            [*kandev_command(), "audit", "verify", "--ledger"],
            env=environment(settings),
            capture_output=True,
            text=True,
            timeout=300,
        )
        if verified.returncode == 0:
            return
        assert time.monotonic() < deadline, verified.stdout + verified.stderr
        time.sleep(2)
