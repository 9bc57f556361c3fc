"""What the creator may see through its private handle: its own creation's
phase and step states. Nobody else, and no way to act on it. A member creator
sees the steps' evidence redacted, an operator or admin in full
(domain/disclosure.py)."""

from __future__ import annotations

from typing import Any

from kandev_es.application import Tasks
from kandev_es.creation.handles import matches, parse_handle
from kandev_es.domain.disclosure import steps_seen
from kandev_es.domain.identity import Identity
from kandev_es.domain.principal import Principal
from kandev_es.errors import CreationNotFound


class CreationStatusService:
    def __init__(self, app: Tasks) -> None:
        self._app = app

    def status(self, principal: Principal | None, text: str) -> dict[str, Any]:
        handle = parse_handle(text)
        if principal is None or handle is None:
            raise CreationNotFound("creation not found")
        identity = self._app.load(handle.identity_id, Identity)
        tenure = identity.tenures.get(handle.tenure) if identity else None
        if (
            tenure is None
            or tenure.actor != principal.actor
            or not matches(tenure.handle_hash, handle.secret, principal.actor, tenure.plan_hash)
        ):
            raise CreationNotFound("creation not found")
        assert identity is not None
        full = principal.is_operator_of(identity.workspace_id)
        return {
            "task_id": str(tenure.task_id),
            "tenure": tenure.number,
            "phase": tenure.phase,
            "epoch": tenure.epoch,
            "released": tenure.released,
            "outcome": tenure.outcome,
            "plan_hash": tenure.plan_hash,
            # The request that claimed it (its X-Request-Id): None before request ids.
            "request_id": tenure.request_id,
            "steps": steps_seen(tenure.steps, full),
        }
