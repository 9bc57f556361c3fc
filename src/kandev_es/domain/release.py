"""A release operation: the operator's stable operation id, recorded once with
its result. A replay returns the stored result and never looks at the
identity again, so it cannot touch a later holder (AC-6)."""

from __future__ import annotations

import uuid
from typing import Any

from eventsourcing.domain import Aggregate

RELEASE_NAMESPACE = uuid.UUID("9a7c5e3b-1d2f-4e6a-8b0c-2d4f6a8c0e1b")


def release_operation_id(workspace_id: uuid.UUID, operation_id: str) -> uuid.UUID:
    return uuid.uuid5(RELEASE_NAMESPACE, f"{workspace_id}\x00{operation_id}")


class ReleaseOperation(Aggregate):
    class Recorded(Aggregate.Created):
        workspace_id: uuid.UUID
        operation_id: str
        external_id: str
        status: int
        result: dict[str, Any]

    def __init__(
        self,
        workspace_id: uuid.UUID,
        operation_id: str,
        external_id: str,
        status: int,
        result: dict[str, Any],
    ) -> None:
        self.workspace_id = workspace_id
        self.operation_id = operation_id
        self.external_id = external_id
        self.status = status
        self.result = result

    @classmethod
    def record(
        cls,
        workspace_id: uuid.UUID,
        operation_id: str,
        external_id: str,
        status: int,
        result: dict[str, Any],
    ) -> ReleaseOperation:
        return cls._create(
            cls.Recorded,
            id=release_operation_id(workspace_id, operation_id),
            workspace_id=workspace_id,
            operation_id=operation_id,
            external_id=external_id,
            status=status,
            result=result,
        )
