"""Webhooks from real processes: `kandev-es webhook deliver` SIGKILLed in the
middle of a request and started again loses nothing and reorders nothing (the
one event in flight comes again, with its webhook-id), on both backends; and
the receiver of docs/webhooks.md, run as written, against `serve`'s own
deliverer."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.receiver import Receiver
from tests.support.served import Launched, ServedProcess, free_port, http

ROOT = Path(__file__).resolve().parents[2]
HOOK_ENV = {
    "KANDEV_WEBHOOK_ALLOW_HTTP": "true",
    "KANDEV_WEBHOOK_ALLOW_NETWORKS": "127.0.0.0/8",
    "KANDEV_WEBHOOK_RETRY_SCHEDULE": "0.2,0.2,0.2,0.2,0.2",
}


def subscribe(server: ServedProcess, url: str) -> dict:
    made = http(
        "POST",
        f"{server.base}/api/v1/workspaces/{server.workspace_id}/webhooks",
        server.token,
        {"url": url, "event_types": ["task.created", "task.updated"]},
    )
    assert made.status == 201, made.body
    return dict(made.body)


def create_tasks(server: ServedProcess, titles: list[str]) -> None:
    for title in titles:
        made = http(
            "POST",
            f"{server.base}/api/v1/tasks",
            server.token,
            {"workspace_id": server.workspace_id, "title": title},
        )
        assert made.status in (200, 201), made.body


def feed_ids(server: ServedProcess) -> list[str]:
    page = http(
        "GET",
        f"{server.base}/api/v1/workspaces/{server.workspace_id}/events?after=0&limit=1000",
        server.token,
    )
    return [item["id"] for item in page.body["items"]]


@pytest.mark.timeout(240)
def test_a_deliverer_killed_mid_request_loses_and_reorders_nothing(settings, tmp_path):
    in_flight = threading.Event()
    release = threading.Event()

    def behaviour(received, nth):
        if received.event["data"]["title"] == "T2" and nth == 1:
            in_flight.set()  # the deliverer now waits for this answer
            release.wait(30)
            return None  # never answered: its connection is gone with the deliverer
        return 200, {}, b"ok"

    env = {**HOOK_ENV, "KANDEV_WEBHOOKS_IN_PROCESS": "false"}
    with (
        Receiver(behaviour) as receiver,
        ServedProcess(settings, tmp_path / "logs", **env) as server,
    ):
        subscribe(server, receiver.url)
        deliverer = Launched(["webhook", "deliver"], settings, tmp_path / "deliver-1.log", **env)
        try:
            create_tasks(server, ["T0", "T1", "T2", "T3"])
            assert in_flight.wait(60), deliverer.log()
            # the deliveries before it are written within FLUSH_SECONDS (20 ms); a
            # kill inside that window sends them again too (same ids, in order)
            time.sleep(0.5)
            os.killpg(deliverer.process.pid, signal.SIGKILL)
            deliverer.process.wait(10)
        finally:
            deliverer.stop()
        release.set()
        create_tasks(server, ["T4", "T5"])  # while no deliverer runs
        expected = feed_ids(server)
        assert len(expected) == 6
        with Launched(["webhook", "deliver"], settings, tmp_path / "deliver-2.log", **env):
            got = receiver.wait_for(lambda r: expected[-1] in [x.webhook_id for x in r], 60)
            metrics = _wait_delivered(server, 6)
        ids = [r.webhook_id for r in got]
        # the event in flight comes again with its id; nothing else twice, all in order
        assert ids == expected[:3] + expected[2:], ids
        assert re.search(r'kandev_webhook_subscriptions\{state="active"\} 1\.0', metrics)


def _wait_delivered(server: ServedProcess, count: int) -> str:
    """/metrics once it counts ``count`` deliveries (each counted in its own write)."""
    deadline = time.monotonic() + 30
    while True:
        metrics = str(http("GET", f"{server.base}/metrics").body)
        found = re.search(r'kandev_webhook_deliveries_total\{result="delivered"\} (\S+)', metrics)
        if found is not None and float(found.group(1)) == count:
            return metrics
        assert time.monotonic() < deadline, metrics[-2000:]
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_deliverers_one_leads_and_the_other_takes_over_when_it_dies(settings, tmp_path):
    """Two `kandev-es webhook deliver` processes on one store (two nodes): one
    delivers, each event once and in order; SIGKILL it and the other takes
    over from the stored cursor: nothing lost, nothing out of order."""
    env = {**HOOK_ENV, "KANDEV_WEBHOOKS_IN_PROCESS": "false"}
    with (
        Receiver() as receiver,
        ServedProcess(settings, tmp_path / "logs", **env) as server,
    ):
        subscribe(server, receiver.url)
        args = ["--log-level", "INFO", "webhook", "deliver"]
        first = Launched(args, settings, tmp_path / "deliver-a.log", **env)
        second = Launched(args, settings, tmp_path / "deliver-b.log", **env)
        try:
            create_tasks(server, ["A0", "A1", "A2"])
            before = feed_ids(server)
            receiver.wait_for(lambda r: [x.webhook_id for x in r] == before, 60)
            leaders = [p for p in (first, second) if "delivers now" in p.output()]
            assert len(leaders) == 1, (first.log(), second.log())
            time.sleep(0.3)  # its progress written (every 20 ms)
            os.killpg(leaders[0].process.pid, signal.SIGKILL)
            leaders[0].process.wait(10)
            create_tasks(server, ["B0", "B1", "B2"])
            expected = feed_ids(server)
            got = receiver.wait_for(lambda r: expected[-1] in [x.webhook_id for x in r], 60)
            other = second if leaders[0] is first else first
            assert "delivers now" in other.output()
        finally:
            first.stop()
            second.stop()
    assert [r.webhook_id for r in got] == expected


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.timeout(240)
def test_a_delivery_is_traced_like_a_request(settings, tmp_path):
    """With traces on, each attempt is a `webhook.deliver` span (its
    subscription, webhook-id, attempt and status) whose traceparent and
    request id the receiver gets, as a caller of the API would send them."""
    from tests.support.otlp import Receiver as Collector

    collector = Collector()
    env = {
        **HOOK_ENV,
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    try:
        with Receiver() as receiver, ServedProcess(settings, tmp_path / "logs", **env) as server:
            made = subscribe(server, receiver.url)
            create_tasks(server, ["traced"])
            [got] = receiver.wait_for(lambda r: len(r) == 1, 60)
            spans = collector.wait(lambda s: any(x.name == "webhook.deliver" for x in s))
    finally:
        collector.close()
    [span] = [s for s in spans if s.name == "webhook.deliver"]
    assert span.parent_span_id == ""  # a root of its own, as a request's
    assert span.attributes["webhook_id"] == got.webhook_id
    assert span.attributes["subscription"] == made["id"]
    assert span.attributes["http.status_code"] == 200
    _version, trace_id, parent_id, _ = got.headers["traceparent"].split("-")
    assert (trace_id, parent_id) == (span.trace_id, span.span_id)
    assert len(got.headers["x-request-id"]) == 32


def receiver_program() -> str:
    page = (ROOT / "docs" / "webhooks.md").read_text(encoding="utf-8")
    block = page.split("<!-- receiver -->\n```python\n", 1)[1].split("```", 1)[0]
    assert len(block.strip().splitlines()) <= 25
    return block


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.timeout(240)
def test_the_receiver_of_the_docs_runs_as_written(settings, tmp_path):
    """The page's receiver verifies the signatures and prints each event once,
    also when the whole feed is replayed (the same webhook-ids again); the
    deliverer is `serve`'s own, in its worker's background."""
    program = tmp_path / "receiver.py"
    program.write_text(receiver_program(), encoding="utf-8")
    port = free_port()
    with ServedProcess(settings, tmp_path / "logs", **HOOK_ENV) as server:
        made = subscribe(server, f"http://127.0.0.1:{port}/kandev")
        env = {**os.environ, "WEBHOOK_SECRET": made["secret"], "PORT": str(port)}
        output = tmp_path / "receiver.out"
        with output.open("wb") as out:
            receiver = subprocess.Popen(
                [sys.executable, str(program)], env=env, stdout=out, stderr=subprocess.DEVNULL
            )
        try:
            _wait_listening(port)
            create_tasks(server, ["first", "second"])
            _wait_lines(output, 2)
            replay = http(
                "POST",
                f"{server.base}/api/v1/workspaces/{server.workspace_id}/webhooks/{made['id']}"
                "/replay",
                server.token,
                {"after": 0},
            )
            assert replay.status == 200, replay.body
            log = http(
                "GET",
                f"{server.base}/api/v1/workspaces/{server.workspace_id}/webhooks/{made['id']}"
                "/deliveries",
                server.token,
            )
            deadline = time.monotonic() + 30
            while sum(1 for a in log.body["items"] if a["result"] == "delivered") < 4:
                assert time.monotonic() < deadline, log.body
                time.sleep(0.2)
                log = http("GET", log_url(server, made), server.token)
            assert all(a["status"] == 204 for a in log.body["items"])
        finally:
            receiver.kill()
            receiver.wait(10)
    lines = output.read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["task.created", "task.created"], lines
    assert len({line.split()[1] for line in lines}) == 2


def log_url(server: ServedProcess, made: dict) -> str:
    return f"{server.base}/api/v1/workspaces/{server.workspace_id}/webhooks/{made['id']}/deliveries"


def _wait_listening(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, "the receiver does not listen"
            time.sleep(0.1)


def _wait_lines(path: Path, count: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while len(path.read_text().splitlines()) < count:
        assert time.monotonic() < deadline, path.read_text()
        time.sleep(0.1)
