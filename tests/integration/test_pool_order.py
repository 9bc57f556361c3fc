"""Both PostgreSQL pools (the event store's and the projections') hand out the
connection returned last, so one caller keeps reusing one hot backend; with
none ready they still wait and time out like any psycopg pool."""

from __future__ import annotations

import pytest
from psycopg_pool import ConnectionPool, PoolTimeout

from kandev_es.storage.pools import serve_most_recent_first
from tests.conftest import postgres_admin_url


def backend_pid(pool: ConnectionPool) -> int:
    with pool.connection() as conn:
        return conn.info.backend_pid


@pytest.fixture
def pool():
    with ConnectionPool(postgres_admin_url(), min_size=3, max_size=3, timeout=0.3) as opened:
        opened.wait()
        serve_most_recent_first(opened)
        yield opened


def test_the_connection_returned_last_is_handed_out_next(pool):
    pids = {backend_pid(pool) for _ in range(10)}
    assert len(pids) == 1


def test_a_plain_pool_rotates_which_is_why_it_is_switched():
    with ConnectionPool(postgres_admin_url(), min_size=3, max_size=3) as plain:
        plain.wait()
        assert len({backend_pid(plain) for _ in range(6)}) == 3


def test_held_connections_are_not_handed_out_twice_and_an_empty_pool_times_out(pool):
    held = [pool.getconn() for _ in range(3)]
    try:
        assert len({conn.info.backend_pid for conn in held}) == 3
        with pytest.raises(PoolTimeout):
            pool.getconn()
    finally:
        for conn in held:
            pool.putconn(conn)
    assert backend_pid(pool) == held[-1].info.backend_pid


def test_switching_twice_changes_nothing(pool):
    kind = type(pool)
    serve_most_recent_first(pool)
    assert type(pool) is kind


@pytest.mark.postgres_only
def test_the_services_pools_are_switched(services):
    assert getattr(type(services.app.recorder.datastore.pool), "most_recent_first", False)
    assert getattr(type(services.database._pool), "most_recent_first", False)
