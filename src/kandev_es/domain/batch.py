"""A batch of creates sent with an ``Idempotency-Key``: the key's record, kept
so a replay answers the first batch's results (AIP-155's request id). Started
(with the body's hash and a lease, Renewed while it runs), Finished with the compact results, or
Abandoned when the batch answered an error (the key is free again: a retry
runs the batch anew, which is safe by external ID). No I/O."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from eventsourcing.domain import Aggregate, event

BATCH_NAMESPACE = uuid.UUID("4d1b7f2e-8a3c-4f5e-9b6d-0c2e4a6f8b1d")


def batch_operation_id(workspace_id: uuid.UUID, key: str) -> uuid.UUID:
    return uuid.uuid5(BATCH_NAMESPACE, f"{workspace_id}\x00{key}")


class BatchOperation(Aggregate):
    """``results``: one compact entry per item once Finished -- index,
    status, outcome, and the task id or the error body."""

    class Started(Aggregate.Created):
        workspace_id: uuid.UUID
        key: str
        body_hash: str
        items: int
        lease_expires_at: datetime

    def __init__(
        self,
        workspace_id: uuid.UUID,
        key: str,
        body_hash: str,
        items: int,
        lease_expires_at: datetime,
    ) -> None:
        self.workspace_id = workspace_id
        self.key = key
        self.body_hash = body_hash
        self.items = items
        self.lease_expires_at = lease_expires_at
        self.results: list[dict[str, Any]] | None = None
        self.abandoned = False

    @classmethod
    def start(
        cls,
        workspace_id: uuid.UUID,
        key: str,
        body_hash: str,
        items: int,
        lease_expires_at: datetime,
    ) -> BatchOperation:
        return cls._create(
            cls.Started,
            id=batch_operation_id(workspace_id, key),
            workspace_id=workspace_id,
            key=key,
            body_hash=body_hash,
            items=items,
            lease_expires_at=lease_expires_at,
        )

    def in_flight(self, now: datetime) -> bool:
        return self.results is None and not self.abandoned and now < self.lease_expires_at

    @event("Restarted")
    def restart(self, lease_expires_at: datetime) -> None:
        """Run again: the last run answered an error, or its lease ran out
        (its process is gone, or it took longer than the lease)."""
        self.lease_expires_at = lease_expires_at
        self.abandoned = False

    @event("Renewed")
    def renew(self, lease_expires_at: datetime) -> None:
        """Still running: the key stays held until this new expiry."""
        self.lease_expires_at = lease_expires_at

    @event("Finished")
    def finish(self, results: list[dict[str, Any]]) -> None:
        self.results = results

    @event("Abandoned")
    def abandon(self, error: str) -> None:
        self.abandoned = True
