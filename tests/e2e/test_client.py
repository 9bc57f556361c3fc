"""kandev_es.client against a real served process: typed outcomes, safe retries
(across a server restart, a real 503 + Retry-After from a stopped database, a
server that hangs past the deadline), lookup/get/update, release and the feed
(resumed after its connection ends or is dropped by a killed server, waiting out
a 503 for a stream slot, never past its deadline)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.parse
import uuid
from datetime import UTC, datetime
from http.client import HTTPConnection
from typing import Any

import httpx
import pytest

from kandev_es.client import Client, ClientError, DeadlineExceeded, Outcome
from kandev_es.config import Settings
from kandev_es.creation.failpoints import marker_dir
from tests.support.postgres import start_cluster
from tests.support.served import ServedProcess, free_port

WAIT_S = 60.0


class Wire:
    """httpx event hooks: every request the client sent (time, path, body bytes)
    and every response it got (time, status, Retry-After)."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, str, bytes]] = []
        self.got: list[tuple[float, int, str | None]] = []

    def hooks(self) -> dict[str, list[Any]]:
        return {"request": [self._request], "response": [self._response]}

    def _request(self, request: httpx.Request) -> None:
        body = request.content if request.method == "POST" else b""
        self.sent.append((time.monotonic(), request.url.path, body))

    def _response(self, response: httpx.Response) -> None:
        self.got.append(
            (time.monotonic(), response.status_code, response.headers.get("Retry-After"))
        )

    def refusals(self) -> list[tuple[float, int, str | None]]:
        return [answer for answer in self.got if answer[1] == 503]

    def assert_each_retry_waited_as_told(self) -> None:
        """After every 503 the next request went out no sooner than its
        Retry-After (the client's own backoff in these tests is 10-20 ms)."""
        for answered, status, retry_after in self.got:
            if status != 503:
                continue
            assert retry_after is not None, "a 503 without Retry-After"
            after = [sent for sent, _, _ in self.sent if sent > answered]
            assert after, "no retry after a 503"
            assert min(after) - answered >= float(retry_after), (answered, self.got, self.sent)


def until(condition, what: str, log=lambda: "") -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"{what}\n{log()}"
        time.sleep(0.05)


def in_thread(call) -> tuple[threading.Thread, list[Any]]:
    """Run ``call`` in a thread; its result or exception lands in the list."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as error:  # reported to the test, which asserts on it
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def joined(thread: threading.Thread, outcome: list[Any], what: str) -> Any:
    thread.join(timeout=WAIT_S)
    assert not thread.is_alive() and outcome, what
    return outcome[0]


@pytest.fixture
def server(settings, tmp_path):
    served = ServedProcess(settings, tmp_path, workers=1)
    try:
        yield served
    finally:
        served.stop()


def test_create_then_retry_is_found_and_lookup_get_update(server):
    with Client(server.base, server.token) as client:
        first = client.create_task(server.workspace_id, "First", external_id="JIRA-1")
        again = client.create_task(server.workspace_id, "First", external_id="JIRA-1")
        assert first.outcome is Outcome.CREATED
        assert again.outcome is Outcome.FOUND_SETTLED
        assert again.task["id"] == first.task["id"]
        held = client.lookup(server.workspace_id, "JIRA-1")
        assert held is not None and held["id"] == first.task["id"]
        assert client.lookup(server.workspace_id, "jira-1") is None
        task = client.get(first.task["id"])
        updated = client.update(task["id"], {"title": "Renamed"}, revision=task["revision"])
        assert updated["title"] == "Renamed"


def test_bad_input_is_a_typed_error_and_not_retried(server):
    with Client(server.base, server.token) as client:
        with pytest.raises(ClientError) as caught:
            client.create_task(server.workspace_id, "", external_id="BAD-1")
        assert (caught.value.status, caught.value.code) == (422, "validation_failed")
        assert client.lookup(server.workspace_id, "BAD-1") is None


def test_release_requires_an_operation_id(server):
    with Client(server.base, server.token) as client, pytest.raises(ValueError):
        client.release(server.workspace_id, "JIRA-1", operation_id="")


def test_connection_refused_until_deadline_raises(tmp_path):
    client = Client(f"http://127.0.0.1:{free_port()}", "kes_none", deadline=0.5)
    with client, pytest.raises(DeadlineExceeded):
        client.create_task(str(uuid.uuid4()), "t", external_id="X-1")


def test_create_retries_across_a_server_restart(settings, tmp_path):
    served = ServedProcess(settings, tmp_path, workers=1)
    token, workspace, port = served.token, served.workspace_id, served.port
    served.stop()
    results: list = []

    def create() -> None:
        with Client(served.base, token, deadline=60) as client:
            results.append(client.create_task(workspace, "Across", external_id="R-1"))

    worker = threading.Thread(target=create)
    worker.start()
    time.sleep(0.5)  # let the client meet a refused connection first
    restarted = ServedProcess(settings, tmp_path, workers=1, port=port)
    try:
        worker.join(timeout=60)
        assert results and results[0].outcome is Outcome.CREATED
        assert results[0].attempts > 1
        with Client(restarted.base, token) as client:
            again = client.create_task(workspace, "Across", external_id="R-1")
        assert again.outcome is Outcome.FOUND_SETTLED
        assert again.task["id"] == results[0].task["id"]
    finally:
        restarted.stop()


def test_release_with_an_operation_id_replays(server):
    with Client(server.base, server.token) as client:
        client.create_task(server.workspace_id, "To release", external_id="REL-1")
        first = client.release(server.workspace_id, "REL-1", operation_id="op-1")
        again = client.release(server.workspace_id, "REL-1", operation_id="op-1")
        assert first == again
        assert client.lookup(server.workspace_id, "REL-1") is None


def test_feed_with_stream_seconds_returns_while_events_keep_coming(server):
    """A writer creates a task every 0.1 s for the whole test; a feed asked for
    2 seconds still returns within about that (it followed the feed for ever
    before: each connection ended after 2 s and the next began), having seen
    events that came after it started; a feed from its last id resumes with
    the next event."""
    ws = server.workspace_id
    stop = threading.Event()

    def write() -> None:
        with Client(server.base, server.token, deadline=30) as writer:
            for n in range(600):
                if stop.wait(0.1):
                    return
                writer.create_task(ws, f"Busy {n}", external_id=f"BUSY-{n}")

    writing = threading.Thread(target=write, daemon=True)
    writing.start()
    try:
        with Client(server.base, server.token, deadline=30) as client:
            until(lambda: client.lookup(ws, "BUSY-0") is not None, "the writer did not start")
            began, began_at = time.monotonic(), datetime.now(UTC)
            thread, outcome = in_thread(lambda: list(client.feed(ws, stream_seconds=2)))
            thread.join(timeout=15)
            took = time.monotonic() - began
            assert not thread.is_alive(), "feed(stream_seconds=2) did not return in 15 s"
            seen = outcome[0]
            assert isinstance(seen, list), seen
            assert 1.9 <= took < 5, took
            # events kept coming while it read: the last was written after it began
            assert datetime.fromisoformat(seen[-1].data["timestamp"]) > began_at, seen[-1]
            following = next(client.feed(ws, int(seen[-1].id), stream_seconds=5))
            assert int(following.id) > int(seen[-1].id)
    finally:
        stop.set()
        writing.join(timeout=30)


def test_create_waits_out_503_retry_after_while_the_database_is_down(tmp_path, cluster_dir):
    """A stopped PostgreSQL makes the served process answer 503 store_unavailable
    with Retry-After (its breaker open). The client resends the identical body,
    each time no sooner than Retry-After, and creates once the database is back;
    a client whose deadline is shorter than Retry-After gives up at once."""
    cluster = start_cluster(cluster_dir / "pg")
    settings = Settings(data_dir=tmp_path / "data", database_url=cluster.url)
    served = ServedProcess(settings, tmp_path, workers=1)
    wire, short = Wire(), Wire()
    try:
        ws = served.workspace_id
        with Client(served.base, served.token) as client:
            assert client.create_task(ws, "Warm", external_id="U-0").outcome is Outcome.CREATED
        cluster.stop()
        patient = Client(
            served.base, served.token, deadline=WAIT_S, timeout=20,
            backoff=0.01, max_backoff=0.02, event_hooks=wire.hooks(),
        )
        thread, outcome = in_thread(
            lambda: patient.create_task(ws, "Outage", external_id="U-1", description="same")
        )
        until(lambda: len(wire.refusals()) >= 2 or not thread.is_alive(), "no answer")
        assert len(wire.refusals()) >= 2, f"{wire.got}\n{outcome}\n{served.log()}"

        # While the patient client's request is the breaker's probe (it waits out
        # the pool timeout), others are refused at once; a hasty request that
        # happens to be the probe itself is cut off at its deadline. Either way
        # one attempt, never a retry past the deadline.
        causes = []
        with Client(served.base, served.token, deadline=0.5, event_hooks=short.hooks()) as hasty:
            while len(causes) < 20 and not any(isinstance(c, ClientError) for c in causes):
                with pytest.raises(DeadlineExceeded) as gave_up:
                    hasty.create_task(ws, "Outage", external_id="U-1", description="same")
                causes.append(gave_up.value.__cause__)
                assert len(short.sent) == len(causes), "retried past the deadline"
        refused = [c for c in causes if isinstance(c, ClientError)]
        assert refused and (refused[0].status, refused[0].code) == (503, "store_unavailable")
        assert all(isinstance(c, ClientError | httpx.TimeoutException) for c in causes), causes

        cluster.start()
        made = joined(thread, outcome, "create did not finish once the database was back")
        patient.close()
        assert not isinstance(made, Exception), repr(made)
        assert made.outcome is Outcome.CREATED and made.attempts == len(wire.sent) > 2
        bodies = {body for _, _, body in wire.sent}
        assert len(bodies) == 1, "a retry sent another body"
        assert json.loads(bodies.pop()) == {
            "workspace_id": ws, "title": "Outage", "description": "same", "external_id": "U-1",
        }
        assert all(retry_after == "1" for _, _, retry_after in wire.refusals())
        wire.assert_each_retry_waited_as_told()
        with Client(served.base, served.token) as client:
            held = client.lookup(ws, "U-1")
        assert held is not None and held["id"] == made.task["id"] and held["title"] == "Outage"
    finally:
        served.stop()
        cluster.stop()


def test_an_attempt_never_outlasts_the_deadline_and_the_retry_finds_its_task(
    settings, tmp_path
):
    """The server stops mid-create (a failpoint waits after the lookup missed);
    a client with a 1 s deadline and a 60 s per-attempt timeout gives up at its
    deadline instead of waiting out the attempt. The abandoned attempt then
    completes, and the caller's retry finds that very task."""
    served = ServedProcess(settings, tmp_path, workers=1, KANDEV_FAILPOINT="lookup:after@wait")
    markers = marker_dir(settings)
    try:
        ws = served.workspace_id
        client = Client(served.base, served.token, deadline=1.0, timeout=WAIT_S)
        thread, outcome = in_thread(
            lambda: client.create_task(ws, "Slow", external_id="H-1")
        )
        # Far longer than the deadline, far shorter than the attempt's timeout.
        thread.join(timeout=WAIT_S / 2)
        alive = thread.is_alive()
        (markers / "lookup_after.continue").touch()
        assert not alive, "the attempt outlasted the client's deadline"
        gave_up = joined(thread, outcome, "create did not return")
        client.close()
        assert isinstance(gave_up, DeadlineExceeded), repr(gave_up)
        assert isinstance(gave_up.__cause__, httpx.TimeoutException), repr(gave_up.__cause__)
        assert (markers / "lookup_after.waiting").exists()
        with Client(served.base, served.token, deadline=WAIT_S) as patient:
            def settled() -> bool:
                held = patient.lookup(ws, "H-1")
                return held is not None and held["creation_complete"] is True

            until(settled, "the abandoned create never completed")
            again = patient.create_task(ws, "Slow", external_id="H-1")
            assert again.outcome is Outcome.FOUND_SETTLED
            landed = patient.lookup(ws, "H-1")
            assert landed is not None and again.task["id"] == landed["id"]
    finally:
        (markers / "lookup_after.continue").touch()
        served.stop()


def test_feed_resumes_from_its_last_id_after_the_server_is_killed(settings, tmp_path):
    """The connection is dropped (the served process SIGKILLed mid-stream); the
    feed reconnects to the restarted server with Last-Event-ID and goes on
    with the next event: nothing skipped, nothing seen twice."""
    served = ServedProcess(settings, tmp_path, workers=1)
    token, ws, port = served.token, served.workspace_id, served.port
    restarted: ServedProcess | None = None
    try:
        with Client(served.base, token, deadline=WAIT_S) as client:
            first = client.create_task(ws, "Before", external_id="K-1").task
            events = client.feed(ws)
            seen = next(events)
            assert first["id"] in str(seen.data)
            os.killpg(served.process.pid, signal.SIGKILL)
            served.process.wait(timeout=WAIT_S)
            restarted = ServedProcess(settings, tmp_path, workers=1, port=port)
            second = client.create_task(ws, "After", external_id="K-2").task
            later = []
            while not later or second["id"] not in str(later[-1].data):
                later.append(next(events))
                assert len(later) < 20, later
        ids = [int(seen.id), *(int(event.id) for event in later)]
        assert ids == sorted(set(ids)), ids
        assert all(event.data != seen.data for event in later), later
    finally:
        served.stop()
        if restarted is not None:
            restarted.stop()


def test_feed_waits_for_a_stream_slot_as_retry_after_says_never_past_its_deadline(
    settings, tmp_path
):
    """With one stream per token and that one held, the server answers the feed
    503 stream_limit_reached with Retry-After: a feed whose deadline is shorter
    gives up after that one answer; a patient one waits as told and streams
    once the held stream ends."""
    served = ServedProcess(settings, tmp_path, workers=1, KANDEV_MAX_STREAMS_PER_TOKEN="1")
    parts = urllib.parse.urlsplit(served.base)
    holder = HTTPConnection(parts.hostname, parts.port, timeout=WAIT_S)
    try:
        ws = served.workspace_id
        with Client(served.base, served.token) as client:
            made = client.create_task(ws, "Streamed", external_id="S-1").task
        holder.request(
            "GET", f"/api/v1/workspaces/{ws}/events/stream?max_seconds=8",
            headers={"Authorization": f"Bearer {served.token}"},
        )
        held = holder.getresponse()
        assert held.status == 200 and held.readline().startswith(b"retry:")

        short = Wire()
        with Client(served.base, served.token, deadline=0.5, event_hooks=short.hooks()) as hasty:
            thread, outcome = in_thread(lambda: next(hasty.feed(ws)))
            gave_up = joined(thread, outcome, "the feed waited past its deadline")
        assert isinstance(gave_up, DeadlineExceeded), repr(gave_up)
        cause = gave_up.__cause__
        assert isinstance(cause, ClientError), repr(cause)
        assert (cause.status, cause.code) == (503, "stream_limit_reached")
        assert len(short.sent) == 1

        wire = Wire()
        with Client(
            served.base, served.token, deadline=WAIT_S, backoff=0.01, max_backoff=0.02,
            event_hooks=wire.hooks(),
        ) as patient:
            thread, outcome = in_thread(lambda: next(patient.feed(ws)))
            event = joined(thread, outcome, "the feed never got a slot")
        assert not isinstance(event, Exception), repr(event)
        assert made["id"] in str(event.data)
        assert wire.refusals() and wire.got[-1][1] == 200
        wire.assert_each_retry_waited_as_told()
    finally:
        holder.close()
        served.stop()
