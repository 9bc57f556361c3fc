"""What a step is, and the context it acts in."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from kandev_es.application import Tasks
from kandev_es.config import Settings
from kandev_es.creation.lease import Lease
from kandev_es.errors import CompensationUnproven, InternalError, KandevError

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
    # The owner's hold on the tenure (creation/lease.py); None outside a drive.
    lease: Lease | None = None

    @property
    def workspace_id(self) -> uuid.UUID:
        return uuid.UUID(self.manifest["workspace_id"])

    @property
    def stop(self) -> threading.Event | None:
        """Set once the lease is lost: a long effect (a git command) stops."""
        return None if self.lease is None else self.lease.lost

    def fence(self) -> None:
        """Before an effect becomes visible: ``LeaseLost`` unless this owner
        still holds the tenure (creation/lease.py ``Lease.check``)."""
        if self.lease is not None:
            self.lease.check()

    def key(self, step_name: str) -> str:
        return f"{self.task_id}:{step_name}"


class StepFailed(InternalError):
    """The effect definitely did not happen and will not: abort the creation.
    ``error`` is what the creating caller receives; ``detail`` (the OS's or
    git's own words, which may quote paths or the agent command) goes only into
    the failed step's stored evidence, which members see without it
    (domain/disclosure.py)."""

    def __init__(self, error: KandevError, detail: str | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.detail = detail


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


def remove_effect(step: Step, ctx: StepContext) -> dict[str, Any]:
    """An operator's abort of one step: its compensation, or where that fails
    its forced removal (a step that has one: ``remove_forcibly``), then the
    proof that nothing is left. Returns the evidence; raises
    ``CompensationUnproven`` while something is left."""
    evidence: dict[str, Any] = {"proof": "absent", "by": "operator"}
    try:
        step.compensate(ctx)
    except Exception as error:  # whatever failed, the operator asked for removal
        evidence["compensation_failed"] = repr(error)[:500]
        forced = getattr(step, "remove_forcibly", None)
        if forced is not None:
            forced(ctx)
            evidence["forced"] = True
    if not step.absent(ctx):
        raise CompensationUnproven(
            f"step {step.name} could not be removed; repair it by hand, then abort again",
            step=step.name,
        )
    return evidence


# WIP ledgers, attachments and sessions are shared by concurrent creations:
# their read-modify-save (``Tasks.retry_on_conflict``) gets more attempts.
SHARED_ATTEMPTS = 16
SHARED_CONTENDED = "a shared record stayed contended; retry the create"
