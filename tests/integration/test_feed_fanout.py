"""One feed reader per process, fanned out to every follower (services/fanout.py),
on both backends: every follower gets every event once, in feed order, however
its catching up, its join and the reader's passes interleave with the saves;
the followers of a workspace get the very same frame bytes from one read; a
follower that falls behind is ended with its cursor while the others go on;
the reader is woken by its own process's saves and, for other processes',
by the log's head; its thread ends with its last follower and at a stop."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from kandev_es.services import fanout
from kandev_es.services.fanout import FeedFanout, FeedSource, StreamAccess, Subscription
from kandev_es.services.feeds import FeedEnded, feed_page
from kandev_es.storage.notifier import SaveBell
from tests.integration.helpers import create

WAIT_S = 30.0


def take_until(follower: Subscription, count: int, seen: list[Any] | None = None) -> list[Any]:
    """Events from ``follower`` until it has handed out ``count`` in all."""
    seen = [] if seen is None else seen
    deadline = time.monotonic() + WAIT_S
    while len(seen) < count:
        assert time.monotonic() < deadline, f"{len(seen)} of {count} events came"
        seen.extend(follower.take(0.2))
    return seen


def made(client: Any, secret: str, count: int, prefix: str) -> list[str]:
    ids = []
    for n in range(count):
        answer = create(client, secret, external_id=f"{prefix}-{n}", title=f"{prefix} {n}")
        assert answer.status_code == 200, answer.json
        ids.append(answer.json["id"])
    return ids


def test_followers_of_a_workspace_get_the_same_frames_from_one_read(
    client, services, workspace, member
):
    _, secret = member
    other = services.workspaces.open("other")
    followers = [services.feeds.subscribe(workspace.id, 0) for _ in range(3)]
    elsewhere = services.feeds.subscribe(other.id, 0)
    try:
        for follower in [*followers, elsewhere]:
            assert follower.take(0.1) == []  # caught up on an empty feed
            follower.take(0.1)  # joined the reader
        before = services.feeds.passes
        ids = made(client, secret, 5, "SAME")
        got = [take_until(follower, 5) for follower in followers]
        assert [event.envelope["subject"] for event in got[0]] == ids
        for each in got[1:]:
            # the very objects the reader made: one read, one encoding
            assert all(a is b for a, b in zip(each, got[0], strict=True))
        assert got[0][0].frame.startswith(f"id: {got[0][0].position}\n".encode())
        assert elsewhere.take(0.3) == []
        assert services.feeds.passes - before <= 5 + 2  # at most a pass a save, not per follower
    finally:
        for follower in [*followers, elsewhere]:
            follower.close()
    assert not services.feeds.running(wait=10), "the reader outlived its followers"


def test_followers_joining_while_events_come_get_each_once_in_order(
    client, services, workspace, member, monkeypatch
):
    """Small pages, so catching up takes several reads; followers start from
    the beginning and from the middle while a thread keeps creating."""
    monkeypatch.setattr(fanout, "PAGE", 4)
    _, secret = member
    first = made(client, secret, 9, "EARLY")
    third = _page(services, workspace.id, 3)["next_cursor"]  # the position of the third
    creator = threading.Thread(target=made, args=(client, secret, 30, "LATE"))
    creator.start()
    followers: list[tuple[Subscription, list[Any]]] = []
    try:
        for after in (0, 0, third):
            follower = services.feeds.subscribe(workspace.id, after)
            followers.append((follower, follower.take(0.05)))
            time.sleep(0.1)
        creator.join()
        expected = [item["subject"] for item in _page(services, workspace.id)["items"]]
        assert expected[:9] == first and len(expected) == 39
        for (follower, seen), skipped in zip(followers, (0, 0, 3), strict=True):
            got = take_until(follower, 39 - skipped, seen)
            assert [event.envelope["subject"] for event in got] == expected[skipped:]
            assert follower.take(0.3) == []  # nothing twice
    finally:
        for follower, _ in followers:
            follower.close()


def _page(services: Any, workspace_id: Any, limit: int = 1000) -> dict[str, Any]:
    return feed_page(services.database, workspace_id, 0, limit, services.app.settled_rows)


def test_a_follower_too_far_behind_is_ended_with_its_cursor_and_holds_nothing_back(
    client, services, workspace, member, monkeypatch
):
    monkeypatch.setattr(fanout, "MAX_BEHIND_EVENTS", 5)
    _, secret = member
    slow = services.feeds.subscribe(workspace.id, 0)
    fast = services.feeds.subscribe(workspace.id, 0)
    try:
        for follower in (slow, fast):
            follower.take(0.1)
            follower.take(0.1)
        ids: list[str] = []
        seen: list[Any] = []
        for n in range(12):  # one at a time: the fast one takes each as it comes
            ids += made(client, secret, 1, f"SLOW-{n}")
            take_until(fast, len(ids), seen)
        assert [e.envelope["subject"] for e in seen] == ids
        with pytest.raises(FeedEnded) as ended:
            slow.take(0.1)
        assert ended.value.reason == "too slow; resume with Last-Event-ID: 0"
        resumed = services.feeds.subscribe(workspace.id, slow.cursor)
        assert [e.envelope["subject"] for e in take_until(resumed, 12)] == ids
        resumed.close()
    finally:
        slow.close()
        fast.close()


def test_the_reader_is_woken_by_its_own_save_as_it_commits(client, services, workspace, member):
    """With a head that never moves, only the save's ring can wake it."""
    source = FeedSource(services.app, services.database)
    source.head = lambda: 0
    reader = FeedFanout(source, StreamAccess(services.app))
    follower = reader.subscribe(workspace.id, 0)
    try:
        follower.take(0.1)
        follower.take(0.1)
        started = time.monotonic()
        [task] = made(client, member[1], 1, "RING")
        [event] = take_until(follower, 1)
        assert event.envelope["subject"] == task
        assert time.monotonic() - started < fanout.CHECK_SECONDS
    finally:
        follower.close()
        reader.stop()


def test_a_save_during_the_wait_after_a_busy_pass_is_handed_out_by_the_next_pass(
    client, services, workspace, member, monkeypatch
):
    """After a pass that handed events out the reader waits, and takes a
    checkpoint of the log's head shortly before its next pass, which then
    settles and hands out what committed until then (on PostgreSQL, without
    it, only the pass after: a row settles by a checkpoint taken once it is
    visible, and the busy pass's own was taken before it)."""
    monkeypatch.setattr(fanout, "BUSY_COALESCE_SECONDS", 2.0)
    monkeypatch.setattr(fanout, "CHECKPOINT_LEAD_SECONDS", 1.0)
    monkeypatch.setattr(fanout, "STALL_SECONDS", 60.0)  # no read to the writers' head
    reader = FeedFanout(FeedSource(services.app, services.database), StreamAccess(services.app))
    follower = reader.subscribe(workspace.id, services.app.max_notification_id())
    try:
        follower.take(0.1)
        follower.take(0.1)
        made(client, member[1], 1, "BUSY")
        take_until(follower, 1)
        busy_pass = reader.passes
        [later] = made(client, member[1], 1, "DURING")  # well before the checkpoint
        [event] = take_until(follower, 1)
        assert event.envelope["subject"] == later
        assert reader.passes == busy_pass + 1
    finally:
        follower.close()
        reader.stop()


def test_the_reader_sees_a_save_it_did_not_make_by_the_head_and_stops_with_its_followers(
    client, services, workspace, member
):
    """A bell nobody rings: another process's save reaches it by the log's head."""
    reader = FeedFanout(FeedSource(services.app, services.database), StreamAccess(services.app),
                        SaveBell())
    follower = reader.subscribe(workspace.id, 0)
    follower.take(0.1)
    follower.take(0.1)
    assert reader.running()
    started = time.monotonic()
    [task] = made(client, member[1], 1, "WATCH")
    [event] = take_until(follower, 1)
    assert event.envelope["subject"] == task
    assert time.monotonic() - started < fanout.CHECK_SECONDS
    follower.close()
    assert not reader.running(wait=10)


def test_a_stop_ends_every_follower_and_the_reader(services, workspace, member):
    follower = services.feeds.subscribe(workspace.id, 0)
    follower.take(0.1)
    follower.take(0.1)
    assert services.feeds.running()
    services.feeds.stop()
    with pytest.raises(FeedEnded) as ended:
        follower.take(1.0)
    assert ended.value.reason == "server stopping"
    assert not services.feeds.running(wait=10)


def test_access_says_why_a_grant_may_no_longer_read(services, workspace, member, admin):
    access = StreamAccess(services.app)
    principal, secret = member
    other = services.workspaces.open("elsewhere")
    grants = [
        access.grant(secret, workspace.id),
        access.grant(secret, other.id),  # a member of another workspace
        access.grant(admin[1], other.id),
        access.grant("not-a-token", workspace.id),
        (None, workspace.id),  # a follower without a token
    ]
    assert access(grants) == [None, "token revoked", None, "token revoked", None]
    services.tokens.revoke(principal.token_id)
    services.workspace_deletion.delete(other.id, actor="test")
    assert access(grants) == [
        "token revoked", "token revoked", "workspace deleted", "token revoked", None
    ]


def test_on_sqlite_reading_the_feed_neither_waits_for_nor_holds_the_writer(
    backend, settings, client, services, workspace, member
):
    """The reader's pass and a feed page read outside any write transaction:
    with another connection holding SQLite's write lock, both answer at once
    (a read that took the lock first would wait for it: busy_timeout, 60 s)."""
    if backend != "sqlite":
        pytest.skip("SQLite's write lock")
    import sqlite3

    [task] = made(client, member[1], 1, "LOCK")
    holder = sqlite3.connect(str(settings.sqlite_path), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        answers: list[Any] = []
        reading = threading.Thread(target=lambda: answers.extend([
            FeedSource(services.app, services.database).read(0, [workspace.id]),
            _page(services, workspace.id),
        ]))
        reading.start()
        reading.join(5)
        assert not reading.is_alive(), "the reads waited for the writer"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    (events, _), page = answers
    assert [e.envelope["subject"] for e in events] == [task]
    assert [item["subject"] for item in page["items"]] == [task]


def test_a_read_for_no_workspace_or_for_the_head_alone_returns_no_event(
    client, services, workspace, member
):
    """What a pass reads when every follower has just left (no workspace), and
    the first pass of a reader (no position yet: the head alone)."""
    made(client, member[1], 2, "NONE")
    source = FeedSource(services.app, services.database)
    head = services.app.max_notification_id()
    assert source.read(0, []) == ([], head)
    assert source.read(None, [workspace.id]) == ([], head)
    events, through = source.read(0, [workspace.id])
    assert len(events) == 2 and through == head


@pytest.mark.postgres_only
def test_a_transaction_held_open_elsewhere_delays_the_reader_by_the_stall_time_only(
    settings, client, services, workspace, member
):
    """The reader follows the settled position its own checkpoints find (one
    statement a pass); a transaction with an id held open anywhere in the
    cluster holds that position back for as long as it stays open. After
    STALL_SECONDS the reader reads to this table's writers' head instead, so
    the events still come (never, while the transaction stays, without it)."""
    import psycopg

    follower = services.feeds.subscribe(workspace.id, services.app.max_notification_id())
    holder = psycopg.connect(settings.postgres.schema_conninfo)
    try:
        follower.take(0.1)
        follower.take(0.1)
        holder.execute("SELECT pg_current_xact_id()")  # an id, held until the end
        ids = made(client, member[1], 3, "HELD")
        started = time.monotonic()
        got = take_until(follower, 3)
        assert [event.envelope["subject"] for event in got] == ids
        assert time.monotonic() - started < fanout.STALL_SECONDS + 5
        assert services.feeds.source.top > services.feeds.source._bound  # still held back
    finally:
        holder.rollback()
        holder.close()
        follower.close()


def test_the_reader_asks_about_its_followers_again_only_once_a_token_or_workspace_moved(
    backend, client, services, workspace, member, operator, monkeypatch
):
    """On PostgreSQL the reader's page statement also says whether the tokens
    and workspaces its last check read have a newer event; only then does it
    ask again (SQLite asks every pass). A revocation is such an event: the
    follower is ended, and no event read after it reaches it."""
    monkeypatch.setattr(fanout, "CHECK_SECONDS", 600.0)  # no timed re-check in the test
    principal, secret = member
    access = StreamAccess(services.app)
    asked: list[int] = []
    checked = access.checked

    def counting(grants: Any) -> Any:
        asked.append(len(grants))
        return checked(grants)

    access.checked = counting  # type: ignore[method-assign]
    reader = FeedFanout(FeedSource(services.app, services.database), access)
    follower = reader.subscribe(
        workspace.id, services.app.max_notification_id(), access.grant(secret, workspace.id)
    )
    try:
        follower.take(0.1)
        follower.take(0.1)
        first = made(client, secret, 3, "ASK")
        assert [e.envelope["subject"] for e in take_until(follower, 3)] == first
        passes, before = reader.passes, len(asked)
        second = made(client, secret, 3, "AGAIN")
        assert [e.envelope["subject"] for e in take_until(follower, 3)] == second
        assert reader.passes > passes
        if backend == "postgres":
            assert len(asked) == before, "asked again though nothing it read had moved"
        services.tokens.revoke(principal.token_id)
        made(client, operator[1], 2, "AFTER")
        deadline = time.monotonic() + WAIT_S
        with pytest.raises(FeedEnded) as ended:
            while time.monotonic() < deadline:
                assert follower.take(0.2) == [], "an event read after the revocation"
        assert ended.value.reason == "token revoked"
    finally:
        follower.close()
        reader.stop()
