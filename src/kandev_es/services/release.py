"""Operator release by stable operation id (AC-6, AC-7). A manual action, never
an automatic recovery: a caller that saw creation_complete=false must not
release and recreate."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from kandev_es.application import Tasks, VersionConflict
from kandev_es.domain.external_id import identity_id, require_external_id
from kandev_es.domain.identity import COMPLETED, PREPARING, Identity
from kandev_es.domain.release import (
    ReleaseOperation,
    release_operation_id,
    validate_operation_id,
)
from kandev_es.domain.task import FORGETTABLE_FIELDS, Task
from kandev_es.errors import (
    Conflict,
    OperationIdReused,
    ReleaseConflict,
    TaskNotFound,
)
from kandev_es.observability.serving import current_request_id
from kandev_es.storage.attestation import AttestationGuard
from kandev_es.views import task_dto

ATTEMPTS = 16
# What a release of an identity with no holder answers (and stores).
NO_HOLDER = TaskNotFound


@dataclass(frozen=True)
class ReleaseResult:
    """``released`` False: the identity had no holder, and ``body`` is the
    ``NO_HOLDER`` answer stored for the operation (the adapters give its status)."""

    released: bool
    body: dict[str, Any]
    replayed: bool


class ReleaseService:
    def __init__(self, app: Tasks, attestation: AttestationGuard) -> None:
        self._app = app
        self._attestation = attestation

    def release(
        self,
        workspace_id: uuid.UUID,
        raw_external_id: object,
        raw_operation_id: str | None,
        *,
        actor: str,
    ) -> ReleaseResult:
        """``actor`` (who releases: ``token:<id>``, or ``cli``) is recorded on
        the Released event for auditors; a replay keeps the first one."""
        operation_id = validate_operation_id(raw_operation_id)
        external_id = require_external_id(raw_external_id)
        self._attestation.require()
        for _ in range(ATTEMPTS):
            stored = self._app.load(
                release_operation_id(workspace_id, operation_id), ReleaseOperation
            )
            if stored is not None:
                return self._replay(stored, external_id, self._forgotten(stored))
            try:
                return self._first_attempt(workspace_id, external_id, operation_id, actor)
            except VersionConflict:
                continue  # a concurrent replay or create: read again, replay first
        raise Conflict("release is contended; retry with the same Idempotency-Key")

    def _forgotten(self, stored: ReleaseOperation) -> bool:
        """Whether the task a stored answer shows has been forgotten since: the
        operation itself, kept in memory by any node that read it before,
        still holds the task's free text as it was (docs/auditing.md: Erasure)."""
        task_id = stored.result.get("id") if stored.released else None
        task = self._app.load(uuid.UUID(str(task_id)), Task) if task_id else None
        return task is not None and bool(task.forgotten)

    @staticmethod
    def _replay(stored: ReleaseOperation, external_id: str, forgotten: bool) -> ReleaseResult:
        if stored.external_id != external_id:
            raise OperationIdReused(
                "this operation id was used to release another identity",
                operation_id=stored.operation_id,
            )
        body = dict(stored.result)
        if forgotten:  # as the stored answer reads once its key is gone
            body.update(dict.fromkeys(FORGETTABLE_FIELDS))
        return ReleaseResult(stored.released, body, replayed=True)

    def _first_attempt(
        self, workspace_id: uuid.UUID, external_id: str, operation_id: str, actor: str
    ) -> ReleaseResult:
        identity = self._app.load(identity_id(workspace_id, external_id), Identity)
        holder = identity.holder if identity else None
        if identity is None or holder is None:
            # Stored too: a replay must answer the same even once someone holds it.
            body: dict[str, Any] = NO_HOLDER("task not found").to_dict()
            self._app.save_atomically(
                ReleaseOperation.record(workspace_id, operation_id, external_id, False, body)
            )
            return ReleaseResult(False, body, replayed=False)
        if holder.phase not in (PREPARING, COMPLETED):
            raise ReleaseConflict(
                f"the creation is {holder.phase}; release after it settles", phase=holder.phase
            )
        task = self._app.load(holder.task_id, Task)
        assert task is not None
        identity.release(
            holder.number, operation_id, "operator", actor=actor,
            request_id=current_request_id(),
        )
        changed: list[Any] = [identity]
        if holder.phase == COMPLETED:
            # One immutable task.updated comes from this event (revision + 1).
            task.clear_external_id(operation_id, "operator")
            changed.append(task)
        # A preparing task publishes nothing now; its Complete drops the ID (AC-7).
        body = {
            **task_dto(task),
            "released": True,
            "operation_id": operation_id,
            "released_external_id": external_id,
            "creation_complete": holder.phase == COMPLETED,
        }
        body.pop("external_id", None)
        operation = ReleaseOperation.record(workspace_id, operation_id, external_id, True, body)
        self._app.save_atomically(*changed, operation)
        return ReleaseResult(True, body, replayed=False)
