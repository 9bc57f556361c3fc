"""/metrics from a real server with 2 gunicorn workers, started both ways
docs/operations.md (Metrics) names — `kandev-es serve --workers 2` and
`kandev-es db init && gunicorn -c http/gunicorn.conf.py 'kandev_es.api:create_app()'`:
creates that land on both workers add up in every scrape, whichever worker answers it; the
per-worker values are read from the run's metrics directory to prove that both workers
really served. A worker killed with SIGKILL keeps its counts in the totals, and
gunicorn's child_exit retires its open-stream gauge. Both backends."""

from __future__ import annotations

import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection
from pathlib import Path

import pytest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from kandev_es.config import Settings, metrics_dir
from tests.support.load import sigkill, wait_for_workers
from tests.support.served import ConfServed, ServedProcess, http, open_event_stream

ROUND = 8
MAX_ROUNDS = 30
SCRAPES = 6
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


Launch = Callable[[], ServedProcess]


@pytest.fixture(params=["serve", "gunicorn.conf"])
def launch(request: pytest.FixtureRequest, settings: Settings, tmp_path: Path) -> Iterator[Launch]:
    started: list[ServedProcess] = []

    def start() -> ServedProcess:
        if request.param == "serve":
            served = ServedProcess(settings, tmp_path, workers=2)
        else:
            served = ConfServed(settings, tmp_path)
        started.append(served)
        return served

    yield start
    for served in started:
        served.stop()


@pytest.fixture
def server(launch: Launch) -> ServedProcess:
    return launch()


def scrape(server: ServedProcess) -> tuple[str, Samples]:
    with urllib.request.urlopen(server.base + "/metrics", timeout=20) as response:
        assert response.status == 200
        content_type = response.headers["Content-Type"]
        text = response.read().decode()
    return content_type, parse(text)


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(
        value
        for (sample_name, sample_labels), value in samples.items()
        if sample_name == name and set(labels.items()) <= set(sample_labels)
    )


def worker_values(directory: Path, pid: int, prefix: str) -> Samples:
    """One worker's own values, from its file in the shared directory."""
    files = [str(path) for path in directory.glob(f"{prefix}_{pid}.db")]
    samples: Samples = {}
    for metric in MultiProcessCollector.merge(files, accumulate=True):
        for sample in metric.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def create(server: ServedProcess, external_id: str, title: str = "metrics") -> str:
    reply = http(
        "POST", server.base + "/api/v1/tasks", server.token,
        {"workspace_id": server.workspace_id, "external_id": external_id, "title": title},
    )
    if reply.status >= 400:
        return str(reply.body["error"])
    return str(reply.body["outcome"])


def open_stream(server: ServedProcess) -> HTTPConnection:
    connection, status, _ = open_event_stream(server, server.token)
    assert status == 200
    return connection


def test_counters_add_up_across_two_workers_and_survive_a_killed_worker(
    server: ServedProcess, settings: Settings
):
    directory = metrics_dir(settings)
    workers = wait_for_workers(server.process.pid, 2)
    # Every create needs a step (the WIP reservation, kind policy), so steps are counted too.
    policy = http(
        "PUT", f"{server.base}/api/v1/workspaces/{server.workspace_id}/policy", server.token,
        {"wip_limit": 100000},
    )
    assert policy.status == 200, policy.body

    def created_by(pid: int) -> float:
        values = worker_values(directory, pid, "counter")
        return total(values, "kandev_creations_total", outcome="created")

    created = 0
    with ThreadPoolExecutor(ROUND) as pool:
        for round_number in range(MAX_ROUNDS):
            ids = [f"METRICS-{round_number}-{i}" for i in range(ROUND)]
            assert list(pool.map(lambda x: create(server, x), ids)) == ["created"] * ROUND
            created += ROUND
            if all(created_by(pid) > 0 for pid in workers):
                break
    per_worker = {pid: created_by(pid) for pid in workers}
    assert all(per_worker.values()), f"creates never reached both workers: {per_worker}"
    assert sum(per_worker.values()) == created

    # A retry of each of the first 3 IDs is a Found; a new ID with a blank
    # title is refused (validation after the lookup missed): errors by type.
    assert [create(server, f"METRICS-0-{i}") for i in range(3)] == ["found_settled"] * 3
    assert create(server, "METRICS-BLANK", title="") == "validation_failed"
    posts = created + 3 + 1

    for _ in range(SCRAPES):  # fresh connections: both workers answer some of them
        content_type, samples = scrape(server)
        assert content_type.startswith("text/plain; version=0.0.4")
        assert total(samples, "kandev_creations_total", outcome="created") == created
        assert total(samples, "kandev_creations_total", outcome="found_settled") == 3
        assert total(samples, "kandev_creation_errors_total") == 1
        assert total(samples, "kandev_creation_errors_total", error="ValidationFailed") == 1
        route = {"method": "POST", "route": "/api/v1/tasks"}
        assert total(samples, "kandev_http_requests_total", **route) == posts
        assert total(samples, "kandev_http_requests_total", status="200", **route) == created + 3
        assert total(samples, "kandev_http_requests_total", status="422", **route) == 1
        assert total(samples, "kandev_http_request_duration_seconds_count", **route) == posts
        assert (
            total(samples, "kandev_creation_steps_total", kind="policy", result="succeeded")
            == created
        )
        assert total(samples, "kandev_store_breaker_open") == 0
        assert {
            dict(labels)["projection"]
            for name, labels in samples
            if name == "kandev_projection_lag_events"
        } == {"tasks", "identities", "creations", "feeds"}
        # The URL rule, never the raw path: no task id or workspace id in a label.
        assert server.workspace_id not in "".join(str(key) for key in samples)

    # An open stream counts on its worker; killing that worker retires it
    # (child_exit) while the worker's counts stay in the totals.
    stream = open_stream(server)
    try:
        _, samples = scrape(server)
        assert total(samples, "kandev_streams_open") == 1
        [holder] = [
            pid
            for pid in workers
            if total(worker_values(directory, pid, "gauge_livesum"), "kandev_streams_open") == 1
        ]
        assert sigkill(holder)
        wait_for_workers(server.process.pid, 2, exclude=[holder])
        server.wait_healthy()
        assert not list(directory.glob(f"gauge_*_{holder}.db"))
        for _ in range(SCRAPES):
            _, samples = scrape(server)
            assert total(samples, "kandev_streams_open") == 0
            assert total(samples, "kandev_creations_total", outcome="created") == created
            assert total(samples, "kandev_creations_total", outcome="found_settled") == 3
    finally:
        stream.close()


def test_a_fresh_start_wipes_the_last_runs_values(launch: Launch):
    first = launch()
    assert create(first, "WIPE-1") == "created"
    assert total(scrape(first)[1], "kandev_creations_total", outcome="created") == 1
    first.stop()
    second = launch()
    # `serve` shows its token once, at the first start; the conf launch makes another workspace.
    second.token, second.workspace_id = first.token, first.workspace_id
    # The identity is still held (a Found), but this run created nothing.
    assert create(second, "WIPE-1") == "found_settled"
    _, samples = scrape(second)
    assert total(samples, "kandev_creations_total", outcome="created") == 0
    assert total(samples, "kandev_creations_total", outcome="found_settled") == 1
