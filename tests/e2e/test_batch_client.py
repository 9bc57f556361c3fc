"""Client.create_many and `kandev-es task import --url` against a real served
process (issue 44 point 6): per-item results in order across chunks, a chunk
whose answer was lost resent with its Idempotency-Key and replayed (one task
per item), and an import run again answering every item found."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import httpx
import pytest

from kandev_es.client import Client
from tests.support.served import ServedProcess, environment, http, kandev_command


@pytest.fixture
def served(settings, tmp_path):
    server = ServedProcess(settings, tmp_path, workers=1)
    yield server
    server.stop()


def task_count(served: ServedProcess) -> int:
    listed = http(
        "GET",
        f"{served.base}/api/v1/workspaces/{served.workspace_id}/tasks?limit=500",
        served.token,
    )
    return len(listed.body["items"])


def test_create_many_yields_each_item_in_order_and_replays_a_lost_chunk(served):
    lost: list[str] = []

    def lose_first_batch_answer(response: httpx.Response) -> None:
        if response.request.url.path.endswith("/tasks/batch") and not lost:
            lost.append(response.request.headers["Idempotency-Key"])
            raise httpx.ReadError("the answer was lost", request=response.request)

    replayed: list[str] = []

    def note(response: httpx.Response) -> None:
        if response.request.url.path.endswith("/tasks/batch"):
            replayed.append(response.headers.get("Idempotent-Replayed", ""))

    items: list[dict[str, Any]] = [{"external_id": f"CM-{n}", "title": f"t{n}"} for n in range(20)]
    items[5] = {"external_id": "CM-5", "title": ""}
    items[9] = {"external_id": "CM-1", "title": "repeat"}
    hooks = {"response": [note, lose_first_batch_answer]}
    with Client(served.base, served.token, event_hooks=hooks) as client:
        results = list(client.create_many(served.workspace_id, items, chunk_size=7))
    assert [r.index for r in results] == list(range(20))
    assert lost and replayed[:2] == ["false", "true"]  # the lost chunk, then its replay
    outcomes = [r.outcome for r in results]
    assert outcomes.count("created") == 18
    assert (outcomes[5], results[5].error["error"]) == ("failed", "validation_failed")
    assert outcomes[9] == "found_settled" and results[9].task["id"] == results[1].task["id"]
    assert task_count(served) == 18

    with Client(served.base, served.token) as client:
        again = list(client.create_many(served.workspace_id, items, chunk_size=500))
    assert [r.outcome for r in again].count("found_settled") == 19
    assert task_count(served) == 18


def test_create_many_splits_chunks_by_bytes_below_the_body_limit(served):
    items = [
        {"external_id": f"BY-{n}", "title": "t", "description": "d" * 90_000} for n in range(12)
    ]
    sizes: list[int] = []

    def size(request: httpx.Request) -> None:
        sizes.append(len(request.content))

    with Client(served.base, served.token, event_hooks={"request": [size]}) as client:
        results = list(client.create_many(served.workspace_id, items))
    assert [r.outcome for r in results] == ["created"] * 12
    assert len(sizes) == 2 and max(sizes) < 1_048_576  # 9 + 3 items, below 900,000 bytes


def test_task_import_over_http_and_again_finds_every_item(served, settings, tmp_path):
    source = tmp_path / "backlog.jsonl"
    source.write_text(
        "".join(json.dumps({"external_id": f"IM-{n}", "title": f"t{n}"}) + "\n" for n in range(25))
    )
    report = tmp_path / "report.jsonl"
    command = [
        *kandev_command(),
        "task",
        "import",
        str(source),
        "--workspace",
        served.workspace_id,
        "--url",
        served.base,
        "--chunk-size",
        "10",
        "--report",
        str(report),
    ]
    env = environment(settings, KANDEV_TOKEN=served.token or "")
    first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert {json.loads(line)["outcome"] for line in report.read_text().splitlines()} == {"created"}
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "found_settled" in again.stdout
    assert {json.loads(line)["outcome"] for line in report.read_text().splitlines()} == {
        "found_settled"
    }
    assert task_count(served) == 25
    no_token = subprocess.run(
        command, env=environment(settings), capture_output=True, text=True, timeout=120
    )
    assert no_token.returncode == 2 and "KANDEV_TOKEN" in no_token.stderr
