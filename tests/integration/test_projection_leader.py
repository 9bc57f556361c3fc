"""One background projection loop per database (projections/leadership.py):
two runners over the same database, each with its own lock session (a separate
PostgreSQL connection, a separate open of the SQLite lock file), as two
processes would have. Exactly one leads; when it stops, the other takes over
and events are still applied; explicit catch-up works in a follower. Both
backends. The served, multi-process version is tests/e2e/test_projection_leader.py."""

from __future__ import annotations

import time

import psycopg
import pytest

from kandev_es.bootstrap import bootstrap
from tests.conftest import postgres_admin_url
from tests.integration.helpers import create
from tests.support.leader import lock_sessions

WAIT_S = 30.0


def _wait_until(predicate, seconds: float = WAIT_S) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _feed_subjects(services) -> list[str]:
    with services.database.transaction() as tx:
        rows = tx.execute("SELECT subject FROM feed_events ORDER BY position")
    return [str(subject) for (subject,) in rows]


def test_one_of_two_runners_leads_and_the_other_takes_over(
    client, services, member, settings
):
    _, secret = member
    other = bootstrap(settings.with_overrides(create_tables=False))
    runners = [services.projections, other.projections]
    threads = [runner.start_thread(poll_seconds=0.05) for runner in runners]
    try:
        assert _wait_until(lambda: any(r.leading for r in runners))
        first = create(client, secret, external_id="LEAD-1", title="one").json["id"]
        assert _wait_until(lambda: first in _feed_subjects(services))
        # Both loops have long been running: the follower asked for the lead
        # and was refused (a second leader would be leading by now).
        assert [r.leading for r in runners].count(True) == 1
        leader = next(r for r in runners if r.leading)
        follower = next(r for r in runners if not r.leading)
        assert follower.waker is None  # a follower does not even LISTEN

        leader.stop()
        threads[runners.index(leader)].join(10)
        assert not leader.leading
        assert _wait_until(lambda: follower.leading)
        second = create(client, secret, external_id="LEAD-2", title="two").json["id"]
        assert _wait_until(lambda: second in _feed_subjects(services))
        assert _feed_subjects(services) == [first, second]
    finally:
        for runner in runners:
            runner.stop()
        for thread in threads:
            thread.join(10)
        other.close()


def test_a_follower_process_still_catches_up_when_asked(client, services, member, settings):
    """catch_up() does its own passes whoever leads: workspace deletion, the
    Runtime and `projections run --once` rely on that."""
    _, secret = member
    other = bootstrap(settings.with_overrides(create_tables=False))
    thread = other.projections.start_thread(poll_seconds=60)  # leads, then sleeps
    try:
        assert _wait_until(lambda: other.projections.leading)
        follower = services.projections.start_thread(poll_seconds=0.05)
        try:
            task = create(client, secret, external_id="ASKED-1", title="asked").json["id"]
            services.projections.catch_up()
            assert not services.projections.leading
            assert task in _feed_subjects(services)
            assert set(services.projections.lag().values()) == {0}
        finally:
            services.projections.stop()
            follower.join(10)
    finally:
        other.projections.stop()
        thread.join(10)
        other.close()


@pytest.mark.postgres_only
def test_a_leader_whose_lock_session_is_killed_stops_leading(
    client, services, member, settings
):
    """The lock lives in the leader's session: when that session dies (here
    terminated by an admin; a network cut or a database restart alike) the lock
    is gone, so the old leader must notice and step down, or two would lead."""
    _, secret = member
    other = bootstrap(settings.with_overrides(create_tables=False))
    runners = [services.projections, other.projections]
    threads = [runner.start_thread(poll_seconds=0.05) for runner in runners]
    try:
        assert _wait_until(lambda: len(lock_sessions(settings)) == 1)
        ((backend, _),) = lock_sessions(settings)
        with psycopg.connect(postgres_admin_url(), autocommit=True) as admin:
            assert admin.execute("SELECT pg_terminate_backend(%s)", (backend,)).fetchone()[0]
        # Whichever runner takes the lock again, in the end one leads, on a new session.
        assert _wait_until(
            lambda: [r.leading for r in runners].count(True) == 1
            and [b for b, _ in lock_sessions(settings)] not in ([], [backend])
        )
        task = create(client, secret, external_id="LOST-1", title="lost").json["id"]
        assert _wait_until(lambda: task in _feed_subjects(services))
        assert [r.leading for r in runners].count(True) == 1
        assert len(lock_sessions(settings)) == 1
    finally:
        for runner in runners:
            runner.stop()
        for thread in threads:
            thread.join(10)
        other.close()
