"""A release operation: the operator's stable operation id, recorded once with
its result. A replay returns the stored result and never looks at the
identity again, so it cannot touch a later holder (AC-6)."""

from __future__ import annotations

import re
import uuid
from typing import Any

from eventsourcing.domain import Aggregate

from kandev_es.errors import MissingOperationId

OPERATION_ID = re.compile(r"[\x21-\x7e]{1,200}")  # fullmatch: no trailing newline

# What a version-1 Recorded event stored for an operation that released a holder.
V1_RELEASED = 200
RELEASE_NAMESPACE = uuid.UUID("9a7c5e3b-1d2f-4e6a-8b0c-2d4f6a8c0e1b")


def validate_operation_id(raw: str | None) -> str:
    """An operator's stable operation id (a release's, a settle's): 1-200
    printable ASCII characters, sent as the Idempotency-Key."""
    if raw is None or raw == "":
        raise MissingOperationId("Idempotency-Key (the operation id) is required")
    if not OPERATION_ID.fullmatch(raw):
        raise MissingOperationId("Idempotency-Key must be 1-200 printable ASCII characters")
    return raw


def release_operation_id(workspace_id: uuid.UUID, operation_id: str) -> uuid.UUID:
    return uuid.uuid5(RELEASE_NAMESPACE, f"{workspace_id}\x00{operation_id}")


class ReleaseOperation(Aggregate):
    """``released``: whether the operation released a holder; False when the
    identity had none (the adapters answer that as task-not-found). ``result``
    is the body first answered, returned again on every replay."""

    class Recorded(Aggregate.Created):
        # Version 1 stored the HTTP status it was answered with (200 released,
        # 404 no holder) instead of ``released``; those events are still read.
        class_version = 2

        workspace_id: uuid.UUID
        operation_id: str
        external_id: str
        released: bool
        result: dict[str, Any]

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            state["released"] = state.pop("status") == V1_RELEASED

    def __init__(
        self,
        workspace_id: uuid.UUID,
        operation_id: str,
        external_id: str,
        released: bool,
        result: dict[str, Any],
    ) -> None:
        self.workspace_id = workspace_id
        self.operation_id = operation_id
        self.external_id = external_id
        self.released = released
        self.result = result

    @classmethod
    def record(
        cls,
        workspace_id: uuid.UUID,
        operation_id: str,
        external_id: str,
        released: bool,
        result: dict[str, Any],
    ) -> ReleaseOperation:
        return cls._create(
            cls.Recorded,
            id=release_operation_id(workspace_id, operation_id),
            workspace_id=workspace_id,
            operation_id=operation_id,
            external_id=external_id,
            released=released,
            result=result,
        )
