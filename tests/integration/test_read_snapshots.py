"""``Tasks.read`` / ``read_many`` / ``snapshot``: the read cache is shared by a
process's threads, but no two threads are ever handed the same aggregate object
— so a command one thread calls on its read by mistake cannot tear what another
thread reads — while one thread reading the same unchanged aggregate again gets
its own copy back without a new copy."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

from kandev_es.domain.workspace import Workspace


def in_two_threads(work: Callable[[], Any]) -> list[Any]:
    """``work`` run once in each of two threads at the same moment."""
    barrier = threading.Barrier(2, timeout=30)
    results: list[Any] = [None, None]

    def run(index: int) -> None:
        barrier.wait()
        results[index] = work()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return results


def test_two_threads_reading_one_cached_aggregate_never_share_the_object(services, workspace):
    app = services.app
    assert app.read(workspace.id, Workspace) is not None  # cached now
    first, second = in_two_threads(lambda: app.read(workspace.id, Workspace))
    assert isinstance(first, Workspace) and isinstance(second, Workspace)
    assert first is not second

    # Also right after a change, when both threads catch up at once.
    current = app.load(workspace.id, Workspace)
    current.set_wip_limit(4)
    app.save_atomically(current)
    first, second = in_two_threads(lambda: app.read_many([workspace.id])[workspace.id])
    assert first is not second and first.wip_limit == second.wip_limit == 4

    first, second = in_two_threads(lambda: app.snapshot(workspace.id, Workspace))
    assert first is not None and first is not second


def test_a_command_on_one_threads_read_is_never_seen_by_another(services, workspace):
    app = services.app
    app.read(workspace.id, Workspace)
    mistaken = threading.Event()
    seen: list[Any] = []
    own: list[Any] = []

    def careless() -> None:
        mine = app.read(workspace.id, Workspace)
        mine.set_wip_limit(9)  # a command on a read, never saved
        mistaken.set()
        # Its own next read is a clean copy too (the version moved on).
        own.append(app.read(workspace.id, Workspace).wip_limit)

    def reader() -> None:
        assert mistaken.wait(timeout=30)
        seen.append(app.read(workspace.id, Workspace).wip_limit)

    threads = [threading.Thread(target=careless), threading.Thread(target=reader)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert seen == [None] and own == [None]
    assert app.read(workspace.id, Workspace).wip_limit is None


def test_one_thread_reading_an_unchanged_aggregate_again_reuses_its_copy(services, workspace):
    """The cache's benefit stays: no copy per read while nothing changed."""
    app = services.app
    once = app.read(workspace.id, Workspace)
    again = app.read_many([workspace.id])[workspace.id]
    assert once is again and app.snapshot(workspace.id, Workspace) is once

    current = app.load(workspace.id, Workspace)
    current.set_wip_limit(2)
    app.save_atomically(current)
    after = app.read(workspace.id, Workspace)
    assert after is not once and after.wip_limit == 2 and once.wip_limit is None


def test_a_read_of_many_streams_catches_each_up_from_its_own_snapshot(services):
    """More streams than one statement reads branch by branch (MANY_STREAMS):
    each is read after its own cached version, the unknown ones are None."""
    app = services.app
    spaces = [services.workspaces.open(f"many-{n}") for n in range(24)]
    ids = [space.id for space in spaces]
    assert all(isinstance(app.read_many(ids)[key], Workspace) for key in ids)  # cached
    for space in spaces[::4]:
        current = app.load(space.id, Workspace)
        current.set_wip_limit(7)
        app.save_atomically(current)
    unknown = [uuid.uuid4() for _ in range(10)]
    read = app.read_many([*ids, *unknown])
    assert [read[key].wip_limit == 7 for key in ids] == [n % 4 == 0 for n in range(24)]
    assert all(read[key] is None for key in unknown)


def test_an_unshared_read_is_built_for_its_caller_and_not_cached(services):
    """``share=False`` (a batch's cold reads): what had to be read from its
    events is the caller's own object, not put in the shared cache; a cached
    snapshot is still handed out as this thread's copy."""
    app = services.app
    space = services.workspaces.open("unshared")
    first = app.read_many([space.id], share=False)[space.id]
    second = app.read_many([space.id], share=False)[space.id]
    assert isinstance(first, Workspace) and isinstance(second, Workspace)
    assert first is not second and first.version == second.version
    assert app._snapshots.get(space.id) is None  # never shared
    shared = app.read_many([space.id])[space.id]  # cached now
    assert app._snapshots.get(space.id) is not None
    assert app.read_many([space.id], share=False)[space.id] is shared  # this thread's copy
