"""Checkpoint coverage under load (issue 36, point 7): for sampled Created
acknowledgements, the time until the latest signed checkpoint of the ledger's
Merkle log covers the created task's event, i.e. until a checkpoint's tree size
is above that event's leaf index (docs/auditing.md: the sequencer logs settled
events and signs every KANDEV_LEDGER_CHECKPOINT_SECONDS or _EVENTS)."""

from __future__ import annotations

import http.client
import threading
import time
import uuid
from collections import Counter
from typing import Any

import psycopg

from benchlib.common import (
    LAG_CLIENTS,
    WAIT_S,
    body,
    failed_requests,
    median_over,
    percentile,
    round_probes,
)
from benchlib.database import connect
from benchlib.server import Client

COVER_TARGET_S = 5.0  # the "a checkpoint covers a new event within 5 s"
COVER_BOUND_S = 30.0  # a sample not covered by then counts as missing
SAMPLE_PAUSE_S = 0.1  # between the prober's own creates
POLL_S = 0.01  # how often the log and its checkpoints are read


class CheckpointProber:
    """While a load runs (start() to stop()), a thread creates its own tasks
    one at a time (SAMPLE_PAUSE_S apart) and notes each acknowledgement; a
    second thread reads the log every POLL_S and times each sample from its
    acknowledgement until a signed checkpoint covers the task's Created event
    (its stream's version 1). Sampling stops with the load; result() waits,
    at most COVER_BOUND_S after the last acknowledgement, for the samples still
    uncovered. The prober's creates count in no rate."""

    def __init__(self, port: int, token: str, workspace: uuid.UUID, url: str, schema: str) -> None:
        self.port, self.token, self.workspace = port, token, workspace
        self.url, self.schema = url, schema
        self.acked: dict[str, float] = {}  # task id -> perf_counter at its 200
        self.covered: dict[str, float] = {}  # task id -> seconds until covered
        self.logged: dict[str, float] = {}  # task id -> seconds until its leaf was seen
        self.stopped = float("inf")  # perf_counter when the load stopped
        self.failures: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.sampling = threading.Event()
        self.done = threading.Event()
        self.sampler = threading.Thread(target=self._sample, daemon=True)
        self.watcher = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> None:
        self.sampler.start()
        self.watcher.start()

    def stop(self) -> None:
        """Stops sampling (the load stopped); coverage is still watched."""
        self.stopped = time.perf_counter()
        self.sampling.set()
        self.sampler.join(timeout=WAIT_S)

    def _sample(self) -> None:
        client = Client(self.port, self.token)
        n = 0
        while not self.sampling.is_set():
            n += 1
            try:
                status, reply = client.request(
                    "POST", "/api/v1/tasks", body(self.workspace, f"CKPT-{n}-{uuid.uuid4()}"))
                acked = time.perf_counter()
                assert status == 200 and reply.get("outcome") == "created", (status, reply)
            except (AssertionError, OSError, http.client.HTTPException) as error:
                self.failures[type(error).__name__] += 1
            else:
                with self.lock:
                    self.acked[str(reply["id"])] = acked
            self.sampling.wait(SAMPLE_PAUSE_S)

    def _uncovered(self) -> list[str]:
        with self.lock:
            return [task for task in self.acked if task not in self.covered]

    def _watch(self) -> None:
        with connect(self.url, self.schema) as conn:
            while not self.done.is_set():
                waiting = self._uncovered()
                if waiting:
                    try:
                        found = _leaves(conn, waiting)
                    except psycopg.Error as error:
                        self.failures[type(error).__name__] += 1
                        found = []
                    now = time.perf_counter()
                    with self.lock:
                        for task, covered in found:
                            self.logged.setdefault(task, now - self.acked[task])
                            if covered:
                                self.covered[task] = now - self.acked[task]
                self.done.wait(POLL_S)

    def result(self) -> dict[str, Any]:
        """The coverage times once every sample is covered (or the bound passed)."""
        last = max(self.acked.values(), default=time.perf_counter())
        while self._uncovered() and time.perf_counter() < last + COVER_BOUND_S:
            time.sleep(POLL_S)
        self.done.set()
        self.watcher.join(timeout=WAIT_S)
        with self.lock:
            times, missing = list(self.covered.values()), len(self.acked) - len(self.covered)
            logged = list(self.logged.values())
            # Whether the sequencer keeps up during the load, or catches up after it.
            late = sum(self.acked[task] + seconds > self.stopped
                       for task, seconds in self.logged.items())
        return {**coverage_summary(times, missing),
                "logged_p50_s": round(percentile(logged, 0.5), 3) if logged else None,
                "logged_p99_s": round(percentile(logged, 0.99), 3) if logged else None,
                "logged_after_the_load": late,
                "failed_requests": dict(self.failures)}


def _leaves(conn: psycopg.Connection[Any], task_ids: list[str]) -> list[tuple[str, bool]]:
    """Of ``task_ids``, those whose Created event is in the log, and whether
    it is below the latest signed checkpoint's tree size (covered)."""
    rows = conn.execute(
        "SELECT l.originator_id, l.leaf_index"
        " < (SELECT coalesce(max(tree_size), 0) FROM ledger_checkpoints)"
        " FROM ledger_leaves l"
        " WHERE l.originator_id = ANY(%s::uuid[]) AND l.originator_version = 1",
        (task_ids,),
    ).fetchall()
    return [(str(task), bool(covered)) for task, covered in rows]


def coverage_summary(times: list[float], missing: int) -> dict[str, Any]:
    return {
        "samples": len(times),
        "p50_s": round(percentile(times, 0.5), 3) if times else None,
        "p99_s": round(percentile(times, 0.99), 3) if times else None,
        "max_s": round(max(times), 3) if times else None,
        "missing": missing,  # not covered within COVER_BOUND_S
    }


def coverage_under_load(rounds: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The rounds' coverage times: medians of their p50s and p99s, the largest
    of their maxima (what the target reads), samples and missing summed; None
    when no round probed (LAG_CLIENTS not among the client counts)."""
    probes = round_probes(rounds, "checkpoint_coverage_under_load")
    if not probes:
        return None
    maxima = [probe["max_s"] for probe in probes if probe.get("max_s") is not None]
    return {
        "clients": LAG_CLIENTS,
        "p50_s": median_over(probes, "p50_s", 3),
        "p99_s": median_over(probes, "p99_s", 3),
        "max_s": max(maxima, default=None),
        "logged_p50_s": median_over(probes, "logged_p50_s", 3),
        "logged_p99_s": median_over(probes, "logged_p99_s", 3),
        "logged_after_the_load": sum(probe.get("logged_after_the_load", 0) for probe in probes),
        "samples": sum(probe["samples"] for probe in probes),
        "missing": sum(probe["missing"] for probe in probes),
        "failed_requests": failed_requests(probes),
        "rounds": len(probes),
        "note": f"while kandev-es takes the {LAG_CLIENTS}-client Created load, a thread of the"
        f" bench creates its own tasks one at a time ({int(SAMPLE_PAUSE_S * 1000)} ms apart)"
        " and another reads the ledger every 10 ms: seconds from each HTTP acknowledgement"
        " until the latest signed checkpoint's tree size is above the leaf of the task's"
        " Created event (samples still uncovered when the load stops are waited for, up to"
        f" {int(COVER_BOUND_S)} s, else missing). p50_s and p99_s are medians over the rounds,"
        " max_s the largest of any round (each round's own under 'rounds'); logged_*: until"
        " the sequencer had appended the leaf, before any checkpoint; logged_after_the_load:"
        " samples whose leaf was appended only once the load had stopped; the server runs"
        " with the default KANDEV_LEDGER_CHECKPOINT_SECONDS and _EVENTS",
    }

