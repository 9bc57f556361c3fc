"""Crash-test failpoints: ``KANDEV_FAILPOINT=<step>:<before|after>`` makes this
process SIGKILL itself the first time it reaches that boundary. One-shot (a
marker file under the data dir), so the restarted server gets past it.
``<step>:<side>@wait`` instead pauses there until ``<boundary>.continue``
appears under failpoints/ (a slow owner, for release/deletion races), and
``<step>:<side>@raise`` raises ``FailpointRaised`` there, every time: at a
step's ``before``/``after`` it is the step raising with its effect not made /
made, so the driver must ask the world (an unknown result). Several
failpoints may be armed at once, comma-separated (``repository:after@raise,
repository:unknown``: raise after the effect, then die once it is recorded
unknown)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from kandev_es.config import Settings, data_path


class FailpointRaised(RuntimeError):
    """What an armed ``@raise`` failpoint raises: no error this code knows."""


def hit(settings: Settings, boundary: str) -> None:
    if not settings.failpoint:
        return
    armed = settings.failpoint.split(",")
    if f"{boundary}@wait" in armed:
        _wait(settings, boundary)
        return
    if f"{boundary}@raise" in armed:
        raise FailpointRaised(f"failpoint {boundary}")
    if boundary not in armed:
        return
    marker = data_path(settings, "failpoints", boundary.replace(":", "_") + ".fired")
    marker.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def marker_dir(settings: Settings) -> Path:
    return data_path(settings, "failpoints")


def _wait(settings: Settings, boundary: str, limit_seconds: float = 120.0) -> None:
    name = boundary.replace(":", "_")
    directory = marker_dir(settings)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.waiting").touch()
    deadline = time.monotonic() + limit_seconds
    while time.monotonic() < deadline and not (directory / f"{name}.continue").exists():
        time.sleep(0.02)
