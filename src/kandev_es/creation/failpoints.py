"""Crash-test failpoints: ``KANDEV_FAILPOINT=<step>:<before|after>`` makes this
process SIGKILL itself the first time it reaches that boundary. One-shot (a
marker file under the data dir), so the restarted server gets past it."""

from __future__ import annotations

import os
import signal

from kandev_es.config import Settings, data_path


def hit(settings: Settings, boundary: str) -> None:
    if settings.failpoint != boundary:
        return
    marker = data_path(settings, "failpoints", boundary.replace(":", "_") + ".fired")
    marker.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)
