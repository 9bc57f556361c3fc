"""What a server's SSE streams cost that server itself, measured apart from the
writes (issue 48, docs/benchmarks.md, ``scripts/bench --fanout-only
--fanout-apart``): a streaming server of one worker and no background process
(KANDEV_BACKGROUND=external) serves N consumers of the workspace feed while
another server makes RATE creates a second, paced, for the run's seconds. The
streaming server's CPU per Created, and per frame and stream, is its feed
reader's passes and its streams' wakes and writes, and nothing else: CPU time
at a rate the machine keeps up with, far less bound to the machine's load than
Created/s at saturation (the section's ratios)."""

from __future__ import annotations

import http.client
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from benchlib.common import body
from benchlib.cpu import cpu_delta, family_cpu
from benchlib.server import Client, Gunicorn

RATE = 60.0  # creates a second, made on the writing server
PACERS = 4  # client threads sharing that rate


def _paced(port: int, token: str, workspace: uuid.UUID, seconds: float) -> list[str]:
    """RATE creates a second for ``seconds`` (fewer if the server is slower);
    the task ids made."""
    made: list[str] = []
    stop = time.monotonic() + seconds

    def run() -> None:
        client, due = Client(port, token), time.monotonic()
        while time.monotonic() < stop:
            try:
                status, reply = client.request(
                    "POST", "/api/v1/tasks", body(workspace, f"APART-{uuid.uuid4()}")
                )
            except (OSError, http.client.HTTPException):
                status, reply = 0, None
            if status == 200 and reply.get("outcome") == "created":
                made.append(reply["id"])
            due += PACERS / RATE
            time.sleep(max(0.0, due - time.monotonic()))

    threads = [threading.Thread(target=run, daemon=True) for _ in range(PACERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return made


def streams_apart(
    env: dict[str, str],
    counts: list[int],
    seconds: float,
    token: str,
    workspace: uuid.UUID,
    tmp: Path,
) -> dict[str, Any]:
    """Per count of streams: the streaming server's CPU per Created and per
    frame and stream, and whether every stream got every task once."""
    from benchlib.fanout import Consumers, _head

    writer = Gunicorn(env, 2, tmp / "apart-writer.log")
    result: dict[str, Any] = {"rate_per_s": RATE}
    try:
        for count in counts:
            streaming = Gunicorn(
                {**env, "KANDEV_BACKGROUND": "external"}, 1, tmp / f"apart-streams-{count}.log"
            )
            consumers = None
            try:
                consumers = Consumers(
                    streaming.port, token, workspace, _head(writer.port, token, workspace), count
                )
                time.sleep(1.0)  # each caught up and joined the reader
                before = family_cpu(streaming.process.pid)
                made = _paced(writer.port, token, workspace, seconds)
                spent = cpu_delta(before, family_cpu(streaming.process.pid))
                delivered = consumers.delivered(made)
            finally:
                if consumers is not None:
                    consumers.stop()
                streaming.stop()
            per_created = spent / 1e3 / max(len(made), 1)
            result[str(count)] = {
                "created": len(made),
                "streaming_cpu_us_per_created": round(per_created, 1),
                "streaming_cpu_us_per_frame_per_stream": round(per_created / count, 2),
                "missing": delivered["missing"],
                "twice": delivered["twice"],
                "ended": delivered["ended"],
            }
    finally:
        writer.stop()
    return result
