"""CPU by component inside a served worker, for scripts/bench's cost tables.

Loaded only by the gunicorn config scripts/bench writes for its --scaling
servers (http/gunicorn.conf.py executed as is, plus a post_fork that calls
``start``): kandev-es and the CRUD peer are measured the same way, and a
server started without it is untouched. Nothing here is part of kandev_es.

How: the functions that bound each component (``BOUNDARIES``: Flask's
wsgi_app, the token check, the reads, the event mapper, the save, the office
number, each projection...) are wrapped in each worker after the fork. While
a phase is set (the first line of ``<dir>/phase``, polled every 50 ms; empty
= off, the wrappers then only test one flag), a wrapper reads the thread's
own CPU clock (time.thread_time_ns) on entry and exit and charges the CPU in
between to its component, less what nested components took (exclusive
time, like a profiler's tottime, but only at these boundaries: about ten
wrapped calls per request, so the overhead is a few µs, not a profiler's
doubling). CPU outside every boundary (waitress' I/O thread, the request
thread between requests, psycopg_pool's workers, the WSGI glue) is what the
bench reports as "HTTP server and the rest": the process total (/proc) less
what the boundaries measured. On each phase change the worker writes
``<dir>/<pid>.json``: per phase, CPU ns by component, its psycopg pools'
statistics deltas (checkouts, waits for a connection), and its facts (worker
class, threads, workers, pooled connections at most).
"""

from __future__ import annotations

import functools
import gc
import inspect
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

POLL_S = 0.05

# (module, attribute path, component): the functions wrapped, per side.
KANDEV = [
    ("flask.app", "Flask.wsgi_app", "Flask + API"),
    ("kandev_es.services.auth", "TokenService.authenticate", "auth"),
    ("kandev_es.services.auth", "TokenService.authenticate_unconfirmed", "auth"),
    ("kandev_es.services.auth", "TokenService.authenticate_run", "auth"),
    ("kandev_es.creation.service", "CreationService.create", "creation and event building"),
    ("kandev_es.creation.found", "Holders.read_ids", "reads"),
    ("kandev_es.creation.found", "Holders.lookup", "reads"),
    ("kandev_es.creation.found", "Holders.found", "reads"),
    ("kandev_es.storage.recorders", "KandevPostgresRecorder.select_streams", "reads"),
    # The lookup that also draws the office number: one statement, counted as a read.
    ("kandev_es.storage.recorders", "KandevPostgresRecorder.select_streams_drawing", "reads"),
    ("kandev_es.storage.recorders", "KandevPostgresRecorder.select_events", "reads"),
    ("eventsourcing.persistence", "Mapper.to_domain_event", "event decoding"),
    ("eventsourcing.persistence", "Mapper.to_stored_event", "event encoding"),
    # The application's mapper seals tasks' free text (storage/sealing.py).
    ("kandev_es.storage.sealing", "SealingMapper.to_domain_event", "event decoding"),
    ("kandev_es.storage.sealing", "SealingMapper.to_stored_event", "event encoding"),
    ("kandev_es.storage.recorders", "KandevPostgresRecorder.insert_events",
     "save statement (+NOTIFY)"),
    ("kandev_es.storage.recorders", "KandevPostgresRecorder._notify", "NOTIFY after saves"),
    ("kandev_es.storage.recorders", "KandevPostgresRecorder.next_office_number",
     "office number"),
    ("kandev_es.projections.runner", "ProjectionRunner.run_once", "projection runner"),
    ("kandev_es.projections.tasks", "TasksProjection.apply_batch", "projection tasks"),
    ("kandev_es.projections.tasks", "TasksProjection.apply", "projection tasks"),
    ("kandev_es.projections.creations", "CreationsProjection.apply_batch", "projection creations"),
    ("kandev_es.projections.creations", "CreationsProjection.apply", "projection creations"),
    ("kandev_es.projections.identities", "IdentitiesProjection.apply_batch",
     "projection identities"),
    ("kandev_es.projections.identities", "IdentitiesProjection.apply",
     "projection identities"),
    ("kandev_es.projections.feeds", "FeedsProjection.apply_batch", "projection feeds"),
    ("kandev_es.projections.feeds", "FeedsProjection.apply", "projection feeds"),
]
PEER = [
    ("flask.app", "Flask.wsgi_app", "Flask + API"),
    ("crud_peer", "authenticate", "auth"),
    ("crud_peer", "lookup", "reads"),
    ("crud_peer", "insert_task", "save statement (+NOTIFY)"),
]
# The batch route's own boundaries (scripts/benchlib/bulk.py's servers only:
# the scaling section's tables keep their components).
JSON = [
    ("flask.json.provider", "DefaultJSONProvider.dumps", "answer JSON encoding"),
    ("flask.json.provider", "DefaultJSONProvider.loads", "request JSON parsing"),
]
KANDEV_BULK = [
    *KANDEV,
    *JSON,
    ("kandev_es.api.context", "parse_json_body", "request JSON parsing"),
    ("kandev_es.bulk.service", "BatchService.create_many", "batch protocol"),
    ("kandev_es.creation.service", "CreationService.validated_fields", "validation"),
    ("kandev_es.creation.service", "CreationService.identity_to_claim",
     "creation and event building"),
    ("kandev_es.creation.service", "CreationService.plan", "creation and event building"),
    ("kandev_es.creation.service", "CreationService.claimed", "creation and event building"),
    ("kandev_es.creation.service", "CreationService.answer", "answer building"),
    ("kandev_es.bulk.results", "ItemResult.to_response", "answer building"),
    ("kandev_es.storage.recorders", "KandevPostgresRecorder.next_office_numbers",
     "office number"),
    ("kandev_es.projections.inline", "InlineViews.__call__", "inline view rows"),
    ("kandev_es.services.ledger", "Sequencer.run_once", "ledger sequencer"),
    ("kandev_es.services.ledger", "Sequencer.checkpoint_if_due", "ledger sequencer"),
]
PEER_BULK = [*PEER, *JSON, ("crud_peer", "insert_batch", "save statement (+NOTIFY)")]
BOUNDARIES = {"kandev": KANDEV, "peer": PEER, "kandev-bulk": KANDEV_BULK, "peer-bulk": PEER_BULK}

_phase = ""
_tables: list[dict[tuple[str, str], int]] = []  # one per thread, summed when written
_local = threading.local()


def _table() -> dict[tuple[str, str], int]:
    table: dict[tuple[str, str], int] | None = getattr(_local, "table", None)
    if table is None:
        table = _local.table = {}
        _local.stack = []
        _local.mark = _local.wall = _local.entered = 0
        _tables.append(table)
    return table


def timed(component: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` charging its exclusive CPU time, and its exclusive wall
    time (CPU plus waiting: I/O, a pooled connection, a lock, the GIL), to
    ``component``; the outermost boundary also records its inclusive wall time."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        phase = _phase
        if not phase:
            return function(*args, **kwargs)
        table = _table()
        stack: list[str] = _local.stack
        now, wall = time.thread_time_ns(), time.perf_counter_ns()
        if stack:  # the enclosing component's own time up to here
            key = (phase, stack[-1])
            table[key] = table.get(key, 0) + now - _local.mark
            key = (phase, "wall:" + stack[-1])
            table[key] = table.get(key, 0) + wall - _local.wall
        else:
            _local.entered = wall
        stack.append(component)
        _local.mark, _local.wall = now, wall
        try:
            return function(*args, **kwargs)
        finally:
            now, wall = time.thread_time_ns(), time.perf_counter_ns()
            name = stack.pop()
            key = (phase, name)
            table[key] = table.get(key, 0) + now - _local.mark
            key = (phase, "wall:" + name)
            table[key] = table.get(key, 0) + wall - _local.wall
            if not stack:
                key = (phase, "inclusive wall:" + name)
                table[key] = table.get(key, 0) + wall - _local.entered
            _local.mark, _local.wall = now, wall

    return wrapper


def install(side: str) -> list[str]:
    """Wrap this side's boundaries; the ones not found are returned."""
    import importlib

    missing = []
    for module_name, path, component in BOUNDARIES[side]:
        try:
            owner: Any = importlib.import_module(module_name)
            *parents, name = path.split(".")
            for parent in parents:
                owner = getattr(owner, parent)
            wrapped = timed(component, getattr(owner, name))
            if isinstance(inspect.getattr_static(owner, name), staticmethod):
                wrapped = staticmethod(wrapped)
            setattr(owner, name, wrapped)
        except (ImportError, AttributeError):
            missing.append(f"{module_name}:{path}")
    return missing


def _pools() -> list[Any]:
    try:
        from psycopg_pool import ConnectionPool
    except ImportError:
        return []
    return [o for o in gc.get_objects() if isinstance(o, ConnectionPool)]


def _pool_stats(pools: list[Any]) -> dict[str, int]:
    total: dict[str, int] = {}
    for pool in pools:
        for key, value in pool.get_stats().items():
            if key in ("requests_num", "requests_queued", "requests_wait_ms",
                       "requests_errors", "connections_num", "usage_ms"):
                total[key] = total.get(key, 0) + int(value)
        total["pool_max"] = total.get("pool_max", 0) + int(pool.max_size)
    return total


class Recorder:
    def __init__(self, directory: Path, facts: dict[str, Any]) -> None:
        self.directory = directory
        self.facts = facts
        self.pools: dict[str, dict[str, int]] = {}

    def wanted(self) -> str:
        try:
            return (self.directory / "phase").read_text().strip()
        except OSError:
            return ""

    def run(self) -> None:
        global _phase
        pools: list[Any] = []
        started: dict[str, int] = {}
        while True:
            wanted = self.wanted()
            if wanted != _phase:
                ended, _phase = _phase, wanted
                if ended:
                    self.finish(ended, pools, started)
                if wanted:
                    pools = pools or _pools()
                    started = _pool_stats(pools)
            time.sleep(POLL_S)

    def finish(self, phase: str, pools: list[Any], started: dict[str, int]) -> None:
        ended = _pool_stats(pools)
        self.pools[phase] = {
            key: value - started.get(key, 0) for key, value in ended.items() if key != "pool_max"
        }
        # the pools exist only once the app is loaded, after post_fork
        self.facts["pool_max_connections"] = ended.get("pool_max", 0)
        time.sleep(POLL_S)  # calls under way when the phase ended finish charging
        phases: dict[str, dict[str, Any]] = {}
        for table in list(_tables):
            for (name, component), ns in list(table.items()):
                entry = phases.setdefault(name, {"cpu_ns": {}})
                entry["cpu_ns"][component] = entry["cpu_ns"].get(component, 0) + ns
        for name, stats in self.pools.items():
            phases.setdefault(name, {"cpu_ns": {}})["pools"] = stats
        target = self.directory / f"{os.getpid()}.json"
        partial = target.with_suffix(".tmp")
        partial.write_text(json.dumps({"facts": self.facts, "phases": phases}))
        partial.replace(target)


def start(directory: str, side: str, worker: Any) -> None:
    """In post_fork of a gunicorn ``worker``: wrap ``side``'s boundaries and
    start the thread that follows the phase."""
    facts: dict[str, Any] = {
        "worker_class": f"{type(worker).__module__}.{type(worker).__name__}",
        "threads": int(worker.cfg.threads),
        "workers": int(worker.cfg.workers),
        "not_wrapped": install(side),
    }
    recorder = Recorder(Path(directory), facts)
    threading.Thread(target=recorder.run, name="cost-recorder", daemon=True).start()
