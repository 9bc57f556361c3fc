"""An operator's settle operation on a parked creation (retry or abort): its
stable operation id, recorded once in the same save as the identity's event.
A replay finds it and never acts on another target (like a release)."""

from __future__ import annotations

import uuid

from eventsourcing.domain import Aggregate

SETTLE_NAMESPACE = uuid.UUID("4f0c2a6e-8b1d-4c3e-9a57-6d2e1f0b3c48")
RETRY = "retry"
ABORT = "abort"


def settle_operation_id(workspace_id: uuid.UUID, operation_id: str) -> uuid.UUID:
    return uuid.uuid5(SETTLE_NAMESPACE, f"{workspace_id}\x00{operation_id}")


class SettleOperation(Aggregate):
    class Recorded(Aggregate.Created):
        workspace_id: uuid.UUID
        operation_id: str
        action: str
        identity_id: uuid.UUID
        tenure: int

    def __init__(
        self,
        workspace_id: uuid.UUID,
        operation_id: str,
        action: str,
        identity_id: uuid.UUID,
        tenure: int,
    ) -> None:
        self.workspace_id = workspace_id
        self.operation_id = operation_id
        self.action = action
        self.identity_id = identity_id
        self.tenure = tenure

    @classmethod
    def record(
        cls,
        workspace_id: uuid.UUID,
        operation_id: str,
        action: str,
        identity_id: uuid.UUID,
        tenure: int,
    ) -> SettleOperation:
        return cls._create(
            cls.Recorded,
            id=settle_operation_id(workspace_id, operation_id),
            workspace_id=workspace_id,
            operation_id=operation_id,
            action=action,
            identity_id=identity_id,
            tenure=tenure,
        )
