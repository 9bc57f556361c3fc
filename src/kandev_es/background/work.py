"""Starting and stopping the background work over one process's services.

The same loops in every layout: a process of their own (``kandev-es
background``, started by `serve`), or threads of each web worker
(``KANDEV_BACKGROUND=threads``, the layout before that process). Each leads
by its own lock (projections/leadership.py, services/ledger.py, the
deliverer's), so however many processes start them, one per database works.
KANDEV_RUNTIME_IN_PROCESS and KANDEV_WEBHOOKS_IN_PROCESS off leave the Runtime
and the deliverer out (to `kandev-es runtime` and `kandev-es webhook deliver`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kandev_es.errors import WebhookKeyMissing

if TYPE_CHECKING:
    from kandev_es.bootstrap import Services
    from kandev_es.runtime.recovery import Runtime

log = logging.getLogger("kandev_es.background")


@dataclass
class Started:
    """What ``start`` started: its threads, and the Runtime (stopped apart:
    the services do not hold it)."""

    threads: list[threading.Thread] = field(default_factory=list)
    runtime: Runtime | None = None

    @property
    def names(self) -> list[str]:
        return [thread.name for thread in self.threads]

    def stop(self, services: Services, wait: float = 5.0) -> None:
        """End every loop (before ``services.close()`` closes the store)."""
        if self.runtime is not None:
            self.runtime.stop()
        services.webhooks.stop()
        services.ledger.stop()
        services.projections.stop()
        for thread in self.threads:
            thread.join(wait)


def start(services: Services) -> Started:
    """The projection loop and the ledger sequencer, and, as the settings say,
    the Runtime and the webhook deliverer: each a daemon thread."""
    settings = services.settings
    started = Started()
    started.threads.append(services.projections.start_thread(settings.projection_poll_seconds))
    started.threads.append(services.ledger.start_thread())
    if settings.runtime_in_process:
        started.runtime = services.runtime()
        started.threads.append(_start_runtime(started.runtime, settings.lease_seconds))
    if settings.webhooks_in_process:
        delivering = _start_webhooks(services)
        if delivering is not None:
            started.threads.append(delivering)
    return started


def _start_webhooks(services: Services) -> threading.Thread | None:
    """A background thread, never a request's: one process per database
    delivers. A node without the deployment's webhook key delivers nothing
    (and so never takes the lead from one that has it)."""
    try:
        deliverer = services.webhooks.deliverer()
    except WebhookKeyMissing as error:
        log.error("webhooks: this process delivers no webhooks: %s", error.message)
        return None
    return deliverer.start_thread()


def _start_runtime(runtime: Runtime, lease_seconds: float) -> threading.Thread:
    """Recover creations whose owner died; the event store fences competing runtimes."""
    thread = threading.Thread(
        target=runtime.run_forever,
        args=(max(1.0, lease_seconds / 4),),
        name="runtime",
        daemon=True,
    )
    thread.start()
    return thread
