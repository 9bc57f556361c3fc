"""Identity history for auditors: the identity's whole stream, across tenures,
straight from the event store (never from a read model).

``identity_history`` returns JSON-ready data (the REST route and ``--json``);
``render_timeline`` turns it into the readable lines the CLI prints.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime
from typing import Any

from kandev_es.application import Tasks
from kandev_es.domain.disclosure import history_entry
from kandev_es.domain.external_id import identity_id
from kandev_es.domain.identity import Identity
from kandev_es.errors import IdentityNotFound, StoreUnavailable

# Not shown: the library's bookkeeping, and the creation handle's hash (a
# credential derivative, useless to an auditor).
_HIDDEN = {"originator_id", "originator_version", "timestamp", "originator_topic", "handle_hash"}
# Who released, for Released events stored before releases named their actor.
UNKNOWN_ACTOR = "unknown"


def _plain(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _entry(event: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "version": event.originator_version,
        "timestamp": event.timestamp.isoformat(),
        "event": type(event).__name__,
    }
    for field in dataclasses.fields(event):
        if field.name not in _HIDDEN:
            entry[field.name] = _plain(getattr(event, field.name))
    return entry


def identity_history(
    app: Tasks, workspace_id: uuid.UUID, external_id: str, *, full: bool
) -> dict[str, Any]:
    """The identity's events in order; ``full`` for an operator or admin, else
    the redacted view (domain/disclosure.py)."""
    key = identity_id(workspace_id, external_id)
    try:
        events = list(app.events.get(key))
    except Exception as error:  # the library raises its own OperationalError
        raise StoreUnavailable(f"event store unavailable: {error}") from None
    if not events or not isinstance(events[0], Identity.Registered):
        raise IdentityNotFound("identity not found")
    identity = app.load(key, Identity)
    holder = identity.holder if identity else None
    return {
        "identity_id": str(key),
        "workspace_id": str(workspace_id),
        "external_id": external_id,
        "holder": None
        if holder is None
        else {"tenure": holder.number, "task_id": str(holder.task_id), "phase": holder.phase},
        "tenures": len(identity.tenures) if identity else 0,
        "events": [history_entry(_entry(event), full) for event in events],
    }


def _request(entry: dict[str, Any]) -> str:
    """Which request did it (its X-Request-Id), when one was recorded."""
    request_id = entry.get("request_id")
    return f", request {request_id}" if request_id else ""


def _describe(entry: dict[str, Any]) -> str:
    kind = entry["event"]
    if kind == "Registered":
        return "identity registered"
    if kind == "Claimed":
        return (
            f"CLAIMED by {entry['actor']} for task {entry['task_id']}"
            f" (owner {entry['owner_id']}, lease until {entry['lease_expires_at']},"
            f" plan {str(entry['plan_hash'])[:12]}){_request(entry)}"
        )
    if kind == "StepRecorded":
        evidence = entry.get("evidence") or {}
        shown = ", ".join(f"{k}={v}" for k, v in evidence.items())
        return f"step {entry['step']} {entry['status']} key={entry['key']}" + (
            f" evidence: {shown}" if shown else ""
        )
    if kind == "RecoveryClaimed":
        return f"RECOVERY by {entry['owner_id']}, epoch {entry['epoch']}{_request(entry)}"
    if kind == "LeaseRenewed":
        return f"lease renewed until {entry['lease_expires_at']} (epoch {entry['epoch']})"
    if kind == "Parked":
        return f"PARKED by the Runtime (left to an operator): {entry['reason']}"
    if kind in ("RecoveryRenewed", "AbortForced"):
        action = "RETRY (a fresh series of takeovers)" if kind == "RecoveryRenewed" else "ABORT"
        return (
            f"operator {action}, operation {entry['operation_id']}, by {entry['actor']},"
            f" epoch {entry['epoch']}{_request(entry)}"
        )
    if kind == "Completing":
        return "completing (all required steps proven)"
    if kind == "Completed":
        return f"COMPLETED, outcome {entry['outcome']}"
    if kind == "Aborting":
        return f"aborting: {entry['reason']}"
    if kind == "Aborted":
        return "ABORTED, compensation proven; identity free"
    if kind == "Released":
        generation = entry.get("deletion_generation")
        extra = f", deletion generation {generation}" if generation is not None else ""
        actor = entry.get("actor") or UNKNOWN_ACTOR
        return (
            f"RELEASED, operation {entry['operation_id']}, reason {entry['reason']}{extra},"
            f" by {actor}{_request(entry)}"
        )
    if kind == "WorkspaceDeletionRecorded":
        return (
            f"workspace deleted, generation {entry['generation']},"
            f" operation {entry['operation_id']} (already released)"
        )
    details = {k: v for k, v in entry.items() if k not in ("version", "timestamp", "event")}
    return f"{kind} {details}"


def render_timeline(history: dict[str, Any]) -> list[str]:
    lines = [
        f"identity {history['identity_id']}",
        f"  workspace {history['workspace_id']}  external_id {history['external_id']!r}",
        f"  {history['tenures']} tenure(s); holder: "
        + (
            "none"
            if history["holder"] is None
            else "tenure {tenure}, task {task_id}, {phase}".format(**history["holder"])
        ),
        "",
    ]
    for entry in history["events"]:
        tenure = entry.get("tenure")
        where = f"tenure {tenure}" if tenure is not None else "        "
        lines.append(f"{entry['timestamp']}  v{entry['version']:<3} {where:<9} {_describe(entry)}")
    return lines
