"""A subscription's delivering thread never waits for its progress write:
while the flusher's write is held up (another transaction holds the row or
the write lock), a 2xx still moves the cursor in memory at once, and the
write, once through, stores what it took without undoing what came after."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from kandev_es.webhooks.progress import Progress
from kandev_es.webhooks.store import Attempt


@pytest.fixture
def settings(settings):
    return settings.with_overrides(webhook_allow_networks=("127.0.0.0/8",))


def attempt(subscription_id, position):
    return Attempt(
        subscription_id, position, f"e{position}", 1, time.time(), "delivered", 204, 1.0, "",
        None, f"r{position}",
    )  # fmt: skip


def test_a_held_up_write_does_not_hold_the_delivering_thread(services, workspace):
    store = services.webhooks.store
    made, _ = services.webhooks.service.create(
        workspace.id, "https://127.0.0.1:9/hook", ["task.created"]
    )
    here = Progress(uuid.UUID(made["id"]))
    here.adopt(store.get(here.id), time.monotonic())
    start = here.s.cursor
    here.advance(attempt(here.id, start + 1), start + 1, 0)

    holding, release = threading.Event(), threading.Event()

    def hold_the_row():
        with services.database.transaction() as tx:
            tx.execute(
                "UPDATE webhook_subscriptions SET description = description WHERE id = ?",
                (here.id if services.database.backend == "postgres" else str(here.id),),
            )
            holding.set()
            release.wait(10)

    holder = threading.Thread(target=hold_the_row)
    holder.start()
    assert holding.wait(10)
    flusher = threading.Thread(target=here.flush, args=(store,))
    flusher.start()
    time.sleep(0.2)
    assert flusher.is_alive()  # its write waits for the holder
    began = time.monotonic()
    here.advance(attempt(here.id, start + 2), start + 2, 0)  # the next 2xx
    assert time.monotonic() - began < 0.1
    release.set()
    holder.join(10)
    flusher.join(10)
    assert not flusher.is_alive()
    assert here.written.cursor == start + 1 and store.get(here.id).cursor == start + 1
    assert here.s.cursor == start + 2 and here.due()  # the later move waits for the next write
    assert here.flush(store)
    assert store.get(here.id).cursor == start + 2
    logged = [a.position for a in store.deliveries(here.id, 10)]
    assert sorted(logged) == [start + 1, start + 2]
