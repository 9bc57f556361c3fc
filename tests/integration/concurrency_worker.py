"""Runs in a separate OS process: one create, released by a shared barrier."""

from __future__ import annotations

from typing import Any

from kandev_es.bootstrap import bootstrap
from kandev_es.config import Settings


def create_once(
    settings: Settings, secret: str, body: dict[str, Any], barrier: Any, out: Any
) -> None:
    services = bootstrap(settings.with_overrides(create_tables=False))
    try:
        principal = services.tokens.authenticate(secret)
        barrier.wait(timeout=120)
        result = services.creation.create(principal, body)
        out.put((result.outcome.value, result.task["id"], result.task["identifier"]))
    except Exception as error:  # reported to the parent, which fails the test
        out.put(("error", repr(error), ""))
    finally:
        services.close()
