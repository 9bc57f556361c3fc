"""A create load over real HTTP for the fault tests (tests/chaos/): client
threads, stdlib only, each sending creates with fresh external IDs plus
retries of IDs it already sent, and recording every answer — status, typed
error code, outcome, task id and how long it took. Every wait is bounded."""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.served import build_request

# The 503 codes a create may answer while the store is unreachable (errors.py).
TYPED_503 = frozenset({"store_unavailable", "unavailable", "creation_handed_over"})
SUCCESS_OUTCOMES = frozenset({"created", "found_settled", "found_unsettled"})


@dataclass(frozen=True)
class Attempt:
    """One create as the client saw it. ``status`` is None when no HTTP answer
    came back (connection refused / reset / closed, or the client timeout)."""

    workspace_id: str
    external_id: str
    retry: bool  # this ID had been sent before
    started: float  # time.monotonic()
    ended: float
    status: int | None
    error: str | None  # the body's error code, or the exception's class name
    outcome: str | None
    task_id: str | None
    retry_after: str | None = None

    @property
    def elapsed(self) -> float:
        return self.ended - self.started

    @property
    def acknowledged_created(self) -> bool:
        return self.status == 200 and self.outcome == "created"

    def within(self, start: float, end: float) -> bool:
        """Sent and answered entirely inside [start, end]."""
        return start <= self.started and self.ended <= end


def call(
    method: str, url: str, token: str, body: Any = None, timeout: float = 30.0
) -> tuple[int | None, Any, dict[str, str], str | None]:
    """(status, json body, headers, connection error class) — never raises for
    HTTP or connection failures."""
    request = build_request(method, url, token, body)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, text, got = response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        status, text, got = error.code, error.read(), dict(error.headers)
    except urllib.error.URLError as error:
        reason = error.reason  # e.g. ConnectionRefusedError while a worker restarts
        kind = type(reason).__name__ if isinstance(reason, Exception) else "URLError"
        return None, None, {}, kind
    except (OSError, http.client.HTTPException) as error:  # reset, closed, timeout
        return None, None, {}, type(error).__name__
    try:
        parsed = json.loads(text) if text else None
    except ValueError:
        parsed = {"error": "not_json", "text": text[:200].decode(errors="replace")}
    return status, parsed, got, None


class CreateLoad:
    """``clients`` threads creating tasks until ``stop``, client ``i`` in
    ``workspaces[i % len(workspaces)]``. External IDs name their client, so
    each belongs to exactly one workspace (``workspace_of``).

    After a failed create a client retries the same ID next with probability
    ``retry_failed``, otherwise moves on to a fresh one (the test retries the
    rest afterwards); a share ``retry_share`` of the other requests re-sends a
    random ID the client already sent, successful or not. ``fields`` go into
    every create's body (e.g. ``repositories``, for creates with real effects)."""

    def __init__(
        self,
        base: str,
        token: str,
        workspaces: Sequence[str],
        *,
        prefix: str,
        clients: int = 4,
        timeout: float = 30.0,
        retry_share: float = 0.2,
        retry_failed: float = 0.5,
        pause_after_failure: float = 0.05,
        fields: Mapping[str, Any] | None = None,
    ) -> None:
        self.base, self.token, self.workspaces = base, token, list(workspaces)
        self.fields = dict(fields or {})
        assert "-" not in prefix, "external IDs are <prefix>-<client>-<n>"
        self.prefix, self.timeout = prefix, timeout
        self.retry_share, self.retry_failed = retry_share, retry_failed
        self.pause_after_failure = pause_after_failure
        self.attempts: list[Attempt] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._client, args=(i,), name=f"load-{i}", daemon=True)
            for i in range(clients)
        ]

    def workspace_of(self, external_id: str) -> str:
        client = int(external_id.split("-")[1])
        return self.workspaces[client % len(self.workspaces)]

    def create(self, external_id: str, retry: bool = True) -> Attempt:
        workspace_id = self.workspace_of(external_id)
        body = {
            "workspace_id": workspace_id,
            "external_id": external_id,
            "title": f"load {external_id}",
            **self.fields,
        }
        started = time.monotonic()
        status, answer, headers, failure = call(
            "POST", self.base + "/api/v1/tasks", self.token, body, self.timeout
        )
        ended = time.monotonic()
        answer = answer if isinstance(answer, dict) else {}
        return Attempt(
            workspace_id=workspace_id,
            external_id=external_id,
            retry=retry,
            started=started,
            ended=ended,
            status=status,
            error=failure if status is None else answer.get("error"),
            outcome=answer.get("outcome"),
            task_id=answer.get("id") if status == 200 else None,
            retry_after=headers.get("Retry-After"),
        )

    def lookup(self, external_id: str) -> tuple[int | None, Any]:
        query = urllib.parse.urlencode({"external_id": external_id})
        workspace_id = self.workspace_of(external_id)
        url = f"{self.base}/api/v1/workspaces/{workspace_id}/tasks/by-external-id?{query}"
        status, body, _, _ = call("GET", url, self.token, timeout=self.timeout)
        return status, body

    def start(self) -> CreateLoad:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout: float = 40.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        assert not alive, f"load clients still blocked after {timeout}s: {alive}"

    def _client(self, index: int) -> None:
        rng = random.Random(f"{self.prefix}-{index}")
        sent: list[str] = []
        again: str | None = None
        while not self._stop.is_set():
            if again is not None:
                external_id, retry = again, True
            elif sent and rng.random() < self.retry_share:
                external_id, retry = rng.choice(sent), True
            else:
                external_id, retry = f"{self.prefix}-{index}-{len(sent) + 1}", False
                sent.append(external_id)
            attempt = self.create(external_id, retry)
            with self._lock:
                self.attempts.append(attempt)
            if attempt.status == 200:
                again = None
            else:
                again = external_id if rng.random() < self.retry_failed else None
                self._stop.wait(self.pause_after_failure)

    # ----- reading the record ------------------------------------------------
    def snapshot(self) -> list[Attempt]:
        with self._lock:
            return list(self.attempts)

    def external_ids(self) -> list[str]:
        return sorted({a.external_id for a in self.snapshot()})

    def acknowledged(self) -> dict[str, str]:
        """external ID -> task id of every acknowledged Created."""
        created: dict[str, str] = {}
        for attempt in self.snapshot():
            if attempt.acknowledged_created:
                assert attempt.task_id is not None
                previous = created.setdefault(attempt.external_id, attempt.task_id)
                assert previous == attempt.task_id, f"two Created for {attempt.external_id}"
        return created


def percentile(values: Iterable[float], share: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def summary(attempts: list[Attempt]) -> dict[str, Any]:
    """Counts by (status, code) and latency figures, for assertion messages."""
    kinds: dict[str, int] = {}
    for attempt in attempts:
        key = f"{attempt.status}:{attempt.error or attempt.outcome}"
        kinds[key] = kinds.get(key, 0) + 1
    elapsed = [a.elapsed for a in attempts]
    return {
        "requests": len(attempts),
        "kinds": kinds,
        "p50_s": round(percentile(elapsed, 0.5), 3),
        "p95_s": round(percentile(elapsed, 0.95), 3),
        "max_s": round(max(elapsed, default=0.0), 3),
    }


def children_of(master_pid: int) -> list[int]:
    """The master's direct children (Linux /proc)."""
    children: set[int] = set()
    for task in Path(f"/proc/{master_pid}/task").glob("*"):
        try:
            children.update(int(p) for p in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return sorted(children)


def is_background(pid: int) -> bool:
    """Whether ``pid`` is a `kandev-es background` process (the one the master
    starts beside its workers: background/supervisor.py)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"kandev_es.cli" in argv and b"background" in argv


def worker_pids(master_pid: int) -> list[int]:
    """The gunicorn workers: the master's direct children but its background process."""
    return [pid for pid in children_of(master_pid) if not is_background(pid)]


def background_pids(master_pid: int) -> list[int]:
    """The master's background processes (one, while it runs)."""
    return [pid for pid in children_of(master_pid) if is_background(pid)]


def wait_for_background(
    master_pid: int, exclude: Iterable[int] = (), timeout: float = 30.0
) -> int:
    """The master's one background process, once there is one not in ``exclude``."""
    gone = set(exclude)
    deadline = time.monotonic() + timeout
    while True:
        pids = [p for p in background_pids(master_pid) if p not in gone]
        if len(pids) == 1:
            return pids[0]
        assert time.monotonic() < deadline, f"background processes {pids}, wanted one"
        time.sleep(0.05)


def wait_for_workers(
    master_pid: int, count: int, exclude: Iterable[int] = (), timeout: float = 30.0
) -> list[int]:
    """Wait until the master has ``count`` live workers none of which is in
    ``exclude`` (the ones just killed); return their pids."""
    gone = set(exclude)
    deadline = time.monotonic() + timeout
    while True:
        pids = [p for p in worker_pids(master_pid) if p not in gone]
        if len(pids) >= count:
            return pids
        assert time.monotonic() < deadline, f"gunicorn has workers {pids}, wanted {count}"
        time.sleep(0.05)


def sigkill(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True
