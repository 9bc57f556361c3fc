"""What every measurement shares: progress on stderr, rates of one caller or of
many threads, percentiles and ratios, a create's body, the load average."""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 60.0


LAG_CLIENTS = 16  # the Created load during which the projection lag is probed


def say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def rate(call: Callable[[], None], seconds: float, warmup: int = 20) -> float:
    for _ in range(warmup):
        call()
    count, started = 0, time.perf_counter()
    deadline = started + seconds
    while True:
        call()
        count += 1
        now = time.perf_counter()
        if now >= deadline:
            return count / (now - started)


def concurrent_rate(make: Callable[[], Callable[[], None]], clients: int, seconds: float) -> float:
    """Each client gets its own callable (its own connection); count calls/s."""
    count, elapsed = concurrent_count(make, clients, seconds)
    return count / elapsed


def concurrent_count(
    make: Callable[[], Callable[[], None]], clients: int, seconds: float,
    started_hook: Callable[[], None] = lambda: None,
    stopped_hook: Callable[[], None] = lambda: None,
) -> tuple[int, float]:
    """(calls, seconds) of ``clients`` threads calling for ``seconds``; the
    hooks run right before the threads are released and right after they
    have all stopped (a warm-up call per client precedes, outside them)."""
    calls = [make() for _ in range(clients)]
    for call in calls:
        call()
    barrier = threading.Barrier(clients + 1)
    counts = [0] * clients
    stop = threading.Event()

    def worker(n: int) -> None:
        barrier.wait()
        while not stop.is_set():
            calls[n]()
            counts[n] += 1

    threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(clients)]
    for thread in threads:
        thread.start()
    started_hook()
    barrier.wait()
    started = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(timeout=WAIT_S)
    elapsed = time.perf_counter() - started
    stopped_hook()
    return sum(counts), elapsed


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def ratio(value: float, baseline: float) -> float:
    return round(value / baseline, 3) if baseline else 0.0


def body(workspace: uuid.UUID, external_id: str | None, title: str = "bench") -> dict[str, Any]:
    created: dict[str, Any] = {"workspace_id": str(workspace), "title": title}
    if external_id is not None:
        created["external_id"] = external_id
    return created


def load_average() -> list[float]:
    """The machine's load average over 1, 5 and 15 minutes (os.getloadavg)."""
    return [round(value, 2) for value in os.getloadavg()]


def round_probes(rounds: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """What a prober measured in each round that ran it (``round[key]``)."""
    return [run[key] for run in rounds if key in run]


def median_over(probes: list[dict[str, Any]], key: str, digits: int) -> float | None:
    """The median over the rounds of ``probe[key]`` (None where absent)."""
    values = [probe[key] for probe in probes if probe.get(key) is not None]
    return round(statistics.median(values), digits) if values else None


def failed_requests(probes: list[dict[str, Any]]) -> dict[str, int]:
    """The rounds' failed requests, counted together by kind."""
    failed: Counter[str] = Counter()
    for probe in probes:
        failed.update(probe["failed_requests"])
    return dict(failed)
