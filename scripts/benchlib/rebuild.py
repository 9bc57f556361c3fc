"""Rebuild: events/s of a from-scratch rebuild of the tasks projection."""

from __future__ import annotations

from typing import Any

from kandev_es.projections.rebuild import rebuild

from kandev_es.bootstrap import Services


def rebuild_rate(services: Services) -> dict[str, Any]:
    """The tasks projection rebuilt over every event the run has saved so far."""
    services.projections.catch_up()
    result = rebuild(services.projections, "tasks", batch_size=5000)
    return {
        "projection": result.name,
        "events": result.position,
        "seconds": round(result.seconds, 2),
        "events_per_s": round(result.events_per_second, 1),
    }
