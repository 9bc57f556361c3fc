"""What an operator scrapes at ``/metrics`` (docs/operations.md: Metrics), kept with
prometheus_client: one set of instruments per process, recorded from one place
each (the request hooks, the create protocol, the step driver, the stream slots,
the store breaker, the Runtime, the projection loop).

Under gunicorn every worker writes its values to files in a directory shared for
one run (the library's multiprocess mode: ``config.metrics_dir``, wiped and
named by the master's ``on_starting`` before any worker forks), so a scrape
answered by any worker adds up all of them, including workers that have since
died. prometheus_client picks its mode when it is first imported, so it is
imported here only when the instruments are first made, never at module import;
and instruments the master made before naming the directory (its first start
records too) are dropped when it names it, before any worker forks.
Outside a multi-process server (``create_app`` in a test, a one-shot command)
the process answers for itself.

Labels are bounded: the URL rule (not the path), a known method, the status,
outcome names, error class names, step kinds. Never an id, a token or a name
someone outside chose.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kandev_es import config

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client.metrics_core import Metric

log = logging.getLogger("kandev_es.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
CREATION_OUTCOMES = ("created", "found_settled", "found_unsettled", "created_identity_lost")
UNMATCHED_ROUTE = "unmatched"


@dataclass(frozen=True)
class Instruments:
    registry: CollectorRegistry
    # Where every worker's values are (multiprocess mode), or None: this process only.
    shared: Path | None
    requests: Counter
    request_seconds: Histogram
    creations: Counter
    creation_errors: Counter
    steps: Counter
    lease_renewals: Counter
    streams_open: Gauge
    stream_refusals: Counter
    streams_too_slow: Counter
    feed_reads: Counter
    breaker_open: Gauge
    breaker_openings: Counter
    pool_waits: Counter
    projection_failures: Counter
    recoveries: Counter
    projection_leader: Gauge
    ledger_refused: Gauge
    ledger_refusals: Counter
    background_writes: Counter


_lock = threading.Lock()
_instruments: Instruments | None = None


def instruments() -> Instruments:
    """This process's instruments, made on first use."""
    global _instruments
    if _instruments is None:
        with _lock:
            if _instruments is None:
                _instruments = _make()
    return _instruments


def _make() -> Instruments:
    from prometheus_client import CollectorRegistry, disable_created_metrics

    shared = _shared_directory()
    # The *_created series say nothing here and multiprocess mode has none.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    registry = CollectorRegistry(auto_describe=True)
    made = Instruments(
        registry=registry,
        shared=shared,
        **_http_instruments(registry),
        **_creation_instruments(registry),
        **_stream_instruments(registry),
        **_store_and_runtime_instruments(registry),
    )
    for outcome in CREATION_OUTCOMES:
        made.creations.labels(outcome)  # present at 0 before the first create
    made.breaker_open.set(0)
    made.projection_leader.set(0)
    made.ledger_refused.set(0)
    return made


def _shared_directory() -> Path | None:
    """The multiprocess directory this process writes to, or None."""
    from prometheus_client import values

    shared = config.multiprocess_metrics_dir()
    if shared is not None and values.ValueClass is values.MutexValue:
        # Imported before the directory was named (preload_app?): the values live
        # in this process only, so it answers for itself rather than for nobody.
        log.error(
            "metrics are per worker: prometheus_client was imported before %s was set",
            config.METRICS_DIR_VARIABLE,
        )
        return None
    return shared


def _http_instruments(registry: CollectorRegistry) -> dict[str, Any]:
    from prometheus_client import Counter, Histogram

    return {
        "requests": Counter(
            "kandev_http_requests", "HTTP requests answered, by method, URL rule and status.",
            ["method", "route", "status"], registry=registry,
        ),
        "request_seconds": Histogram(
            "kandev_http_request_duration_seconds",
            "Seconds from request to response headers, by method and URL rule.",
            ["method", "route"], registry=registry,
        ),
    }


def _creation_instruments(registry: CollectorRegistry) -> dict[str, Any]:
    from prometheus_client import Counter

    return {
        "creations": Counter(
            "kandev_creations", "Creates answered with an outcome, by outcome.",
            ["outcome"], registry=registry,
        ),
        "creation_errors": Counter(
            "kandev_creation_errors", "Creates answered with an error, by error type.",
            ["error"], registry=registry,
        ),
        "steps": Counter(
            "kandev_creation_steps", "Creation step records written, by step kind and result.",
            ["kind", "result"], registry=registry,
        ),
        "lease_renewals": Counter(
            "kandev_creation_lease_renewals",
            "Lease renewals by a creation's owner while a step ran: renewed, or lost"
            " (a newer owner had taken the creation over).",
            ["result"], registry=registry,
        ),
    }


def _stream_instruments(registry: CollectorRegistry) -> dict[str, Any]:
    from prometheus_client import Counter, Gauge

    return {
        "streams_open": Gauge(
            "kandev_streams_open", "Open event streams (SSE slots held), all workers.",
            registry=registry, multiprocess_mode="livesum",
        ),
        "stream_refusals": Counter(
            "kandev_stream_refusals", "Event streams refused at a cap, by which cap.",
            ["limit"], registry=registry,
        ),
        "streams_too_slow": Counter(
            "kandev_streams_too_slow",
            "Event streams ended for falling too far behind the feed (they resume).",
            registry=registry,
        ),
        "feed_reads": Counter(
            "kandev_feed_reads",
            "Reads of the feed by the workers' feed readers, one per process for all streams.",
            registry=registry,
        ),
    }


def _store_and_runtime_instruments(registry: CollectorRegistry) -> dict[str, Any]:
    from prometheus_client import Counter, Gauge

    return {
        "breaker_open": Gauge(
            "kandev_store_breaker_open",
            "1 while a worker's store breaker fails fast (database unreachable), else 0.",
            registry=registry, multiprocess_mode="livemax",
        ),
        "projection_failures": Counter(
            "kandev_inline_projection_failures",
            "Saves rolled back because a read model written in their transaction failed.",
            registry=registry,
        ),
        "breaker_openings": Counter(
            "kandev_store_breaker_openings", "Times a store breaker opened.",
            registry=registry,
        ),
        "pool_waits": Counter(
            "kandev_pool_waits",
            "PostgreSQL connection checkouts that found no idle connection and waited"
            " (for one returned or opened; beyond KANDEV_PG_CONNECT_TIMEOUT, a 503).",
            registry=registry,
        ),
        "recoveries": Counter(
            "kandev_runtime_recoveries",
            "Creations the recovery Runtime took over, by how they ended.",
            ["result"], registry=registry,
        ),
        "projection_leader": Gauge(
            "kandev_projection_leader",
            "Projection loops this server runs: 1 in the one process per database"
            " that leads, else 0 (summed over live workers).",
            registry=registry, multiprocess_mode="livesum",
        ),
        "ledger_refused": Gauge(
            "kandev_ledger_signing_refused",
            "1 while the ledger's sequencer refuses to sign checkpoints (the log is not a"
            " consistent extension of the last one it signed, or its key is gone):"
            " docs/auditing.md. Summed over live workers.",
            registry=registry, multiprocess_mode="livesum",
        ),
        "ledger_refusals": Counter(
            "kandev_ledger_signing_refusals",
            "Sequencer passes that refused to sign a due checkpoint.",
            registry=registry,
        ),
        "background_writes": Counter(
            "kandev_background_write_transactions",
            "Write transactions committed by background writers, not by a request:"
            " the projection loop's tracked positions, the ledger's sequencer.",
            ["writer"], registry=registry,
        ),
    }


# ----- recording, one call per place --------------------------------------
# Each request's two labelled children, kept: the keys are bounded (see above)
# and looking children up by labels costs more than recording into them.
_request_children: dict[tuple[str, str | None, int], tuple[Any, Any]] = {}


def record_request(method: str, route: str | None, status: int, seconds: float) -> None:
    children = _request_children.get((method, route, status))
    if children is None:
        known = method if method in HTTP_METHODS else "OTHER"
        rule = route or UNMATCHED_ROUTE
        made = instruments()
        children = (
            made.requests.labels(known, rule, str(status)),
            made.request_seconds.labels(known, rule),
        )
        if method in HTTP_METHODS:  # an unknown method must not grow the cache
            _request_children[(method, route, status)] = children
    children[0].inc()
    children[1].observe(seconds)


def record_creation(outcome: str, count: int = 1) -> None:
    """``count`` creates answered ``outcome`` (a batch counts each outcome once)."""
    instruments().creations.labels(outcome).inc(count)


def record_creation_error(error: BaseException) -> None:
    instruments().creation_errors.labels(type(error).__name__).inc()


def record_lease_renewal(result: str) -> None:
    """``renewed`` or ``lost`` (creation/lease.py)."""
    instruments().lease_renewals.labels(result).inc()


def record_step(step_name: str, result: str) -> None:
    # "repository:<name>", "attachment:<sha>": the kind only, never the name.
    instruments().steps.labels(step_name.split(":", 1)[0], result).inc()


def stream_opened() -> None:
    instruments().streams_open.inc()


def stream_closed() -> None:
    instruments().streams_open.dec()


def stream_refused(limit: str) -> None:
    instruments().stream_refusals.labels(limit).inc()


def stream_too_slow() -> None:
    instruments().streams_too_slow.inc()


def feed_read() -> None:
    instruments().feed_reads.inc()


def record_projection_failure() -> None:
    instruments().projection_failures.inc()


def breaker_opened() -> None:
    made = instruments()
    made.breaker_open.set(1)
    made.breaker_openings.inc()


def breaker_closed() -> None:
    instruments().breaker_open.set(0)


def record_pool_wait() -> None:
    instruments().pool_waits.inc()


def record_recovery(result: str) -> None:
    instruments().recoveries.labels(result).inc()


def record_background_write(writer: str) -> None:
    """A background writer (``projections``, ``ledger``) committed a write."""
    instruments().background_writes.labels(writer).inc()


def ledger_signing_refused(refused: bool) -> None:
    """The ledger's sequencer in this process refuses to sign (or no longer)."""
    instruments().ledger_refused.set(1 if refused else 0)


def record_ledger_refusal() -> None:
    instruments().ledger_refusals.inc()


def projection_leadership(gained: bool) -> None:
    """The projection loop of this process took (True) or lost the lead."""
    gauge = instruments().projection_leader
    if gained:
        gauge.inc()
    else:
        gauge.dec()


# ----- a process apart from a server ---------------------------------------
# How long the metrics listener of ``serve_alone`` waits for a scraper's request.
ALONE_REQUEST_SECONDS = 10.0


def serve_alone(port: int, projection_lag: Callable[[], Mapping[str, int]]) -> Any:
    """``kandev-es background --metrics-port``: this process's own values and
    the projection lag at http://127.0.0.1:<port>/metrics, for a background
    process run apart from a server (no server's scrape sees it). Loopback only,
    a thread per scrape, each connection's reads bounded; the server, to close."""
    import threading
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client import CollectorRegistry, make_wsgi_app
    from prometheus_client.exposition import ThreadingWSGIServer

    class _Handler(WSGIRequestHandler):
        timeout = ALONE_REQUEST_SECONDS  # a silent connection is closed, not kept

        def log_message(self, format: str, *args: Any) -> None:
            """No line per scrape."""

    scrape = CollectorRegistry(auto_describe=False)
    scrape.register(_Forward(instruments().registry))
    scrape.register(_ProjectionLag(projection_lag))
    server = make_server(
        "127.0.0.1", port, make_wsgi_app(scrape), ThreadingWSGIServer, handler_class=_Handler
    )
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


# ----- the gunicorn master ------------------------------------------------
def start_multiprocess(settings: config.Settings) -> Path:
    """In the master before any worker forks: a fresh directory for this run
    (values left by an earlier run would be added to this one's), named in the
    environment the workers inherit."""
    directory = config.metrics_dir(settings)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink(missing_ok=True)
    config.export_multiprocess_metrics_dir(directory)
    _forget_instruments()
    return directory


def _forget_instruments() -> None:
    """Drop what this master recorded before the directory was named: first
    start's store work records too (a PostgreSQL pool's first checkout waits),
    which made the instruments here, in this process's memory. Workers forked
    with them would each answer for themselves and never write a file, so a
    scrape would see one worker. prometheus_client then chooses its mode again,
    from the directory now named, for the instruments each worker makes."""
    global _instruments
    with _lock:
        _instruments = None
        _request_children.clear()
    if "prometheus_client" in sys.modules:  # else its first import reads the directory
        from prometheus_client import values

        values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]


def worker_exited(pid: int) -> None:
    """gunicorn's child_exit: a dead worker's live gauges (open streams, breaker)
    stop counting; its counters and histograms stay in the totals."""
    directory = config.multiprocess_metrics_dir()
    if directory is None:
        return
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid, str(directory))  # type: ignore[no-untyped-call]


# ----- the scrape ---------------------------------------------------------
def exposition(
    projection_lag: Callable[[], Mapping[str, int]],
    from_store: Callable[[], Iterable[Metric]] | None = None,
) -> bytes:
    """The text format for every worker's values, plus the projection lag and
    ``from_store``'s families (the webhooks') read from the database now (the
    same answer whichever worker scrapes)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    made = instruments()
    scrape = CollectorRegistry(auto_describe=False)
    if made.shared is not None:
        MultiProcessCollector(scrape, path=str(made.shared))  # type: ignore[no-untyped-call]
    else:
        scrape.register(_Forward(made.registry))
    scrape.register(_ProjectionLag(projection_lag))
    if from_store is not None:
        scrape.register(_FromStore(from_store))
    return generate_latest(scrape)


class _FromStore:
    def __init__(self, families: Callable[[], Iterable[Metric]]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        try:
            return list(self._families())
        except Exception as error:  # the store is down: scrape the rest, say so in the log
            log.warning("metrics read from the store not scraped: %s", error)
            return []


class _Forward:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterable[Metric]:
        return self._registry.collect()


class _ProjectionLag:
    def __init__(self, lag: Callable[[], Mapping[str, int]]) -> None:
        self._lag = lag

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        try:
            lags: Mapping[str, Any] = self._lag()
        except Exception as error:  # the store is down: scrape the rest, say so in the log
            log.warning("projection lag not scraped: %s", error)
            return
        family = GaugeMetricFamily(
            "kandev_projection_lag_events",
            "Events not yet applied, per projection (read from the store at scrape).",
            labels=["projection"],
        )
        for name, lag in sorted(lags.items()):
            family.add_metric([name], lag)
        yield family
