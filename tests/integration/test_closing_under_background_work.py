"""Closing the application while background threads (an agent's reaper) still
hold work for the store: close waits for a call in flight, and a call that
starts after close touches nothing. Without this, a reaper revoking a run
credential on SQLite used a connection close() had just freed (a segfault)."""

from __future__ import annotations

import threading
import time
import uuid

from kandev_es.bootstrap import bootstrap
from kandev_es.config import Settings
from kandev_es.services.auth import TokenService


def test_a_background_call_after_close_touches_nothing(settings: Settings) -> None:
    services = bootstrap(settings)
    app = services.app
    services.close()
    with app.unless_closed() as usable:
        assert usable is False


def test_close_waits_for_a_background_call_in_flight(settings: Settings) -> None:
    services = bootstrap(settings)
    app = services.app
    workspace = services.workspaces.open("reaped")
    run_id = str(uuid.uuid4())
    services.tokens.issue(workspace_id=workspace.id, admin=False, label=f"run:{run_id}",
                          run_id=run_id, task_id=uuid.uuid4())
    entered = threading.Event()
    revoked: list[bool] = []

    def reaper() -> None:
        with app.unless_closed() as usable:
            assert usable
            entered.set()
            time.sleep(0.3)  # close() is called meanwhile and must wait
            revoked.append(TokenService(app).revoke_run(run_id, "agent_exited"))

    thread = threading.Thread(target=reaper)
    thread.start()
    assert entered.wait(10)
    services.close()
    thread.join(10)
    assert revoked == [True], "the call in flight finished on an open store"
