"""A stopped database is answered fast: creates fail with the typed
``store_unavailable`` 503 within a couple of seconds (the first one waits out
the pool timeout once; the ones after it are refused at once by the breaker),
nothing is written, and the service recovers by itself once the database is back."""

from __future__ import annotations

import time

import pytest

from kandev_es.bootstrap import bootstrap
from kandev_es.config import Settings
from kandev_es.errors import StoreUnavailable, http_status
from kandev_es.storage.breaker import StoreBreaker
from tests.support.postgres import start_cluster


def timed_failure(call) -> tuple[StoreUnavailable, float]:
    started = time.perf_counter()
    with pytest.raises(StoreUnavailable) as failure:
        call()
    return failure.value, time.perf_counter() - started


def test_creates_fail_fast_with_a_typed_503_while_the_database_is_down(tmp_path, cluster_dir):
    cluster = start_cluster(cluster_dir / "pg")
    services = None
    try:
        services = bootstrap(
            Settings(data_dir=tmp_path / "data", database_url=cluster.url, runtime_in_process=False)
        )
        workspace = services.workspaces.open("outage")
        _, principal = services.tokens.issue(workspace_id=workspace.id, admin=False)
        held = services.creation.create(principal, {"external_id": "O-1", "title": "t"})
        assert held.outcome.value == "created"

        cluster.stop()
        error, first = timed_failure(
            lambda: services.creation.create(principal, {"external_id": "O-2", "title": "t"})
        )
        assert http_status(error) == 503 and error.code == "store_unavailable"
        assert first < 8.0, f"first failure took {first:.1f}s"
        later = [
            timed_failure(
                lambda: services.creation.create(principal, {"external_id": "O-1", "title": "t"})
            )[1]
            for _ in range(5)
        ]
        assert max(later) < 2.5, f"failures after the first took {later}"

        start_cluster(cluster.directory)
        deadline = time.monotonic() + 15
        while True:
            try:
                found = services.creation.create(principal, {"external_id": "O-1", "title": "t"})
                break
            except StoreUnavailable:
                assert time.monotonic() < deadline, "service did not recover"
                time.sleep(0.2)
        assert found.outcome.value == "found_settled" and found.task["id"] == held.task["id"]
        fresh = services.creation.create(principal, {"external_id": "O-2", "title": "t"})
        assert fresh.outcome.value == "created"  # the failed attempt left nothing behind
    finally:
        if services is not None:
            services.close()
        cluster.stop()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_breaker_refuses_at_once_and_lets_one_probe_through_per_interval():
    clock = Clock()
    breaker = StoreBreaker(probe_interval=0.5, clock=clock)
    assert breaker.admit() is False  # closed: everyone passes, nobody probes
    breaker.failed("connection refused")
    with pytest.raises(StoreUnavailable, match="connection refused"):
        breaker.admit()
    clock.now += 0.6
    assert breaker.admit() is True  # the probe
    with pytest.raises(StoreUnavailable):
        breaker.admit()  # while the probe is out, others are refused
    breaker.failed("still down")
    with pytest.raises(StoreUnavailable, match="still down"):
        breaker.admit()
    breaker.succeeded(started=99.0)  # a call begun before the failure proves nothing
    with pytest.raises(StoreUnavailable):
        breaker.admit()
    clock.now += 0.6
    assert breaker.admit() is True
    breaker.succeeded(started=clock.now)
    assert breaker.admit() is False and not breaker.is_open


def test_only_a_connection_that_cannot_be_had_opens_the_breaker():
    import psycopg
    from eventsourcing.persistence import OperationalError
    from psycopg_pool import PoolTimeout

    from kandev_es.storage.breaker import means_unreachable

    assert means_unreachable(PoolTimeout("couldn't get a connection after 1.00 sec"))
    wrapped = OperationalError("couldn't get a connection")
    wrapped.__cause__ = PoolTimeout("couldn't get a connection")
    assert means_unreachable(wrapped)
    # A deadlock, or the one dead connection a restart leaves behind, says
    # nothing about the next call.
    assert not means_unreachable(psycopg.errors.DeadlockDetected("deadlock detected"))
    assert not means_unreachable(psycopg.OperationalError("terminating connection"))
