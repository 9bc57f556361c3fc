"""Runs in a separate OS process: one create, released by a shared barrier."""

from __future__ import annotations

import os
from typing import Any

from kandev_es.bootstrap import bootstrap
from kandev_es.config import Settings


def create_once(
    settings: Settings, secret: str, body: dict[str, Any], barrier: Any, out: Any,
    environ: dict[str, str],
) -> None:
    os.environ.update(environ)  # a forked process has its fork server's environment
    # 32 forked at once connect at once: more than KANDEV_PG_CONNECT_TIMEOUT's
    # default 1 s for PostgreSQL to fork them all on a loaded machine, and what
    # is tried here is the create, once every process is set up.
    services = None
    try:
        services = bootstrap(settings.with_overrides(create_tables=False, pg_connect_timeout=30))
        principal = services.tokens.authenticate(secret)
        barrier.wait(timeout=120)
        result = services.creation.create(principal, body)
        out.put((result.outcome.value, result.task["id"], result.task["identifier"]))
    except Exception as error:  # reported to the parent, which fails the test
        out.put(("error", repr(error), ""))
    finally:
        if services is not None:
            services.close()
