"""Background loops in threads of their own that their owner stops and waits
for: ``stop`` returns once each loop has ended (at most STOP_WAIT_SECONDS), so
the store they read is closed only after them. A close under a pass still
running used SQLite's connection after it was closed, which crashes the
interpreter (seen: the projection loop's checkpoint as an MCP server closed)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("kandev_es")
STOP_WAIT_SECONDS = 10.0


def start(target: Callable[..., Any], name: str, threads: list[threading.Thread],
          args: tuple[Any, ...] = ()) -> threading.Thread:
    """Run ``target`` in a daemon thread, remembered in ``threads``."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.start()
    threads[:] = [each for each in threads if each.is_alive()] + [thread]
    return thread


def stop(stopping: threading.Event, threads: list[threading.Thread]) -> None:
    """Tell the loops to stop (``stopping``), then wait for each to end."""
    stopping.set()
    for thread in list(threads):
        if thread is threading.current_thread():
            continue
        thread.join(STOP_WAIT_SECONDS)
        if thread.is_alive():
            log.warning("%s did not stop within %.0f s", thread.name, STOP_WAIT_SECONDS)
    threads[:] = [each for each in threads if each.is_alive()]
