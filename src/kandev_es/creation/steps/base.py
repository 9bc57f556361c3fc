"""What a step is, and the context it acts in."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from kandev_es.application import Tasks
from kandev_es.config import Settings
from kandev_es.errors import InternalError, KandevError

STARTED = "started"
SUCCEEDED = "succeeded"
FAILED = "failed"
UNKNOWN = "unknown"
COMPENSATED = "compensated"


class RunCredentials(Protocol):
    """What agent launch needs of the token service, injected by bootstrap so
    creation never imports the service layer above it."""

    def issue_run(self, workspace_id: uuid.UUID, run_id: str, task_id: uuid.UUID) -> str:
        """A fresh secret bound to the run; RunCredentialRevoked once it has ended."""
        ...

    def revoke_run(self, run_id: str, reason: str) -> bool:
        """End the run's credential (idempotent)."""
        ...


@dataclass(frozen=True)
class StepContext:
    app: Tasks
    settings: Settings
    identity_id: uuid.UUID
    tenure: int
    task_id: uuid.UUID
    manifest: dict[str, Any]
    credentials: RunCredentials

    @property
    def workspace_id(self) -> uuid.UUID:
        return uuid.UUID(self.manifest["workspace_id"])

    def key(self, step_name: str) -> str:
        return f"{self.task_id}:{step_name}"


class StepFailed(InternalError):
    """The effect definitely did not happen and will not: abort the creation.
    ``error`` is what the creating caller receives."""

    def __init__(self, error: KandevError) -> None:
        super().__init__(error.message)
        self.error = error


class Step(Protocol):
    name: str

    def run(self, ctx: StepContext) -> dict[str, Any]:
        """Perform the effect idempotently; return evidence. Raise StepFailed."""
        ...

    def reconcile(self, ctx: StepContext) -> dict[str, Any] | None:
        """Evidence if the effect is fully present in the world, else None."""
        ...

    def compensate(self, ctx: StepContext) -> None:
        """Undo the effect, whatever part of it exists. Idempotent."""
        ...

    def absent(self, ctx: StepContext) -> bool:
        """Proof of compensation: nothing of the effect is left."""
        ...


def save_with_retry(app: Tasks, load: Any, change: Any, attempts: int = 16) -> Any:
    """Load an aggregate, apply ``change`` and save; re-read on a version clash."""
    from kandev_es.application import VersionConflict

    for _ in range(attempts):
        aggregate = load()
        change(aggregate)
        if not aggregate.pending_events:
            return aggregate
        try:
            app.save_atomically(aggregate)
        except VersionConflict:
            continue
        return aggregate
    raise StepFailed(_contended())


def _contended() -> KandevError:
    from kandev_es.errors import Conflict

    return Conflict("a shared record stayed contended; retry the create")
