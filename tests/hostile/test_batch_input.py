"""Big batches (issue 44 point 8), over a real served process: 1,000 items
with 64 KiB descriptions (a 62.5 MiB body) are refused at the default body
limit before the body is read, the worker's memory unmoved; with the limit
raised to take them, the batch is processed with a bounded peak (measured:
see docs/api.md, Batch create)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kandev_es.config import Settings
from tests.hostile.test_request_limits import raw_answer, settled_rss_kb, worker_rss_kb
from tests.support.load import worker_pids
from tests.support.served import ServedProcess, http

ITEMS = 1000
DESCRIPTION = 64 * 1024
RSS_MARGIN_KB = 20 * 1024


def big_batch(workspace_id: str | None = None) -> bytes:
    return json.dumps(
        {
            "workspace_id": workspace_id,
            "tasks": [
                {"external_id": f"BIG-{n}", "title": f"t{n}", "description": "d" * DESCRIPTION}
                for n in range(ITEMS)
            ],
        }
    ).encode()


def worker_peak_kb(server: ServedProcess) -> int:
    """The one worker's peak resident memory so far (VmHWM)."""
    (worker,) = worker_pids(server.process.pid)  # not the background process beside it
    for line in Path(f"/proc/{worker}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_batch_over_the_body_limit_is_413_before_its_body_is_read(
    settings: Settings, tmp_path: Path
) -> None:
    """Memory is the web server's business here, not the store's: one backend."""
    served = ServedProcess(settings, tmp_path)
    try:
        idle = settled_rss_kb(served)
        size = len(big_batch())
        head = (
            "POST /api/v1/tasks/batch HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {served.token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {size}\r\n\r\n"
        ).encode()
        status, body = raw_answer(served.port, head)
        assert (status, body["error"]) == (413, "payload_too_large"), body
        assert worker_rss_kb(served) - idle < RSS_MARGIN_KB
        listed = http(
            "GET", f"{served.base}/api/v1/workspaces/{served.workspace_id}/tasks", served.token
        )
        assert listed.body["items"] == []
    finally:
        served.stop()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_with_the_limit_raised_the_batch_is_processed_with_a_bounded_peak(
    settings: Settings, tmp_path: Path
) -> None:
    served = ServedProcess(settings, tmp_path, KANDEV_MAX_BODY_BYTES=str(80 << 20))
    raw = big_batch(served.workspace_id)
    try:
        idle = settled_rss_kb(served)
        answer = http(
            "POST",
            served.base + "/api/v1/tasks/batch",
            served.token,
            raw=raw,
            headers={"Content-Type": "application/json"},
            timeout=300,
        )
        assert answer.status == 200, answer.body
        assert answer.body["summary"]["created"] == ITEMS
        peak = worker_peak_kb(served)
        print(f"body {len(raw) / 2**20:.1f} MiB: worker idle {idle} kB, peak {peak} kB")
        assert peak - idle < 4 * len(raw) / 1024, (idle, peak)
    finally:
        served.stop()
