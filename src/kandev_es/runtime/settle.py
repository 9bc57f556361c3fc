"""Operators settle every creation: the ones the Runtime parked (taken over
KANDEV_RECOVERY_ATTEMPTS times, still unfinished) are listed with their
reason and step evidence, and an operator either **retries** one (after a
repair: a fresh bounded series of takeovers) or **aborts** it (every effect
that exists removed -- forcibly where its compensation fails -- with evidence,
then Aborted: the identity is free, the create may be sent again). Both are
idempotent by operation id, like a release: the operation is recorded once,
in the same save as the identity's event (RecoveryRenewed / AbortForced), so
the identity's history shows who did what; a replay acts on nothing new,
except to finish an abort it began."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kandev_es.application import Tasks, VersionConflict
from kandev_es.creation.driver import CreationDriver, Fenced
from kandev_es.domain.disclosure import steps_seen
from kandev_es.domain.errors import DomainRuleBroken
from kandev_es.domain.identity import ABORTING, Identity, Tenure
from kandev_es.domain.release import validate_operation_id
from kandev_es.domain.settle import ABORT, RETRY, SettleOperation, settle_operation_id
from kandev_es.errors import (
    Conflict,
    CreationNotParked,
    IdentityNotFound,
    OperationIdReused,
)
from kandev_es.observability import serving
from kandev_es.projections.runner import ProjectionRunner
from kandev_es.runtime.recovery import ABANDONED_REASON, expired_tenures
from kandev_es.storage.database import Database

ATTEMPTS = 8


@dataclass(frozen=True)
class SettleResult:
    body: dict[str, Any]
    replayed: bool


def parked_entry(identity: Identity, tenure: Tenure) -> dict[str, Any]:
    """What an operator sees of a parked creation: where it stands, why it
    was parked, and every step's state with its full evidence."""
    entry: dict[str, Any] = {
        "identity_id": str(identity.id),
        "tenure": tenure.number,
        "workspace_id": str(identity.workspace_id),
        "task_id": str(tenure.task_id),
        "phase": tenure.phase,
        "epoch": tenure.epoch,
        "takeovers": tenure.takeovers,
        "reason": tenure.parked_reason or ABANDONED_REASON,
        "abort_reason": tenure.abort_reason,
        "steps": steps_seen(tenure.steps, True),
    }
    if identity.external_id is not None:
        entry["external_id"] = identity.external_id
    return entry


class ParkedCreations:
    def __init__(
        self,
        app: Tasks,
        database: Database,
        projections: ProjectionRunner,
        driver: CreationDriver,
        attempts: int,
    ) -> None:
        self._app = app
        self._database = database
        self._projections = projections
        self._driver = driver
        self._attempts = attempts

    def list(self, workspace_id: uuid.UUID | None = None) -> list[dict[str, Any]]:
        now = datetime.now(UTC)
        expired = expired_tenures(self._app, self._database, self._projections, now, workspace_id)
        return [
            parked_entry(identity, tenure)
            for identity, tenure in expired
            if tenure.parked(self._attempts, now)
        ]

    def settle(
        self,
        action: str,
        workspace_id: uuid.UUID,
        identity_id: uuid.UUID,
        raw_operation_id: str | None,
        *,
        actor: str,
        tenure: int | None = None,
    ) -> SettleResult:
        """``action`` RETRY: a fresh series of takeovers for a parked creation
        (the Runtime takes it over again at its next scan, and may park it
        again). ABORT: remove whatever it made and end it Aborted, now."""
        if action not in (RETRY, ABORT):
            raise ValueError(f"no settle action {action!r}")
        operation_id = validate_operation_id(raw_operation_id)
        for _ in range(ATTEMPTS):
            stored = self._app.load(
                settle_operation_id(workspace_id, operation_id), SettleOperation
            )
            if stored is not None:
                return self._replay(stored, action, identity_id)
            identity, held = self._parked(workspace_id, identity_id, tenure)
            try:
                if action == RETRY:
                    identity.renew_recovery(
                        held.number, operation_id, actor=actor,
                        request_id=serving.current_request_id(),
                    )
                else:
                    identity.force_abort(
                        held.number, operation_id, actor=actor,
                        request_id=serving.current_request_id(),
                    )
            except DomainRuleBroken as refused:
                raise CreationNotParked(str(refused), phase=held.phase) from None
            operation = SettleOperation.record(
                workspace_id, operation_id, action, identity_id, held.number
            )
            try:
                self._app.save_atomically(identity, operation)
            except VersionConflict:
                continue  # a concurrent settle or takeover: read again
            return SettleResult(self._finish(operation), replayed=False)
        raise Conflict("the creation is contended; retry with the same operation id")

    def _parked(
        self, workspace_id: uuid.UUID, identity_id: uuid.UUID, number: int | None
    ) -> tuple[Identity, Tenure]:
        identity = self._app.load(identity_id, Identity)
        if identity is None or identity.workspace_id != workspace_id:
            raise IdentityNotFound("identity not found")
        now = datetime.now(UTC)
        candidates = [
            t
            for t in identity.tenures.values()
            if (number is None or t.number == number) and t.parked(self._attempts, now)
        ]
        if not candidates:
            raise CreationNotParked(
                "no parked creation of this identity: the Runtime has not given it up"
            )
        return identity, candidates[-1]

    def _replay(self, stored: SettleOperation, action: str, identity_id: uuid.UUID) -> SettleResult:
        if (stored.action, stored.identity_id) != (action, identity_id):
            raise OperationIdReused(
                f"this operation id was used to {stored.action} identity {stored.identity_id}",
                operation_id=stored.operation_id,
            )
        return SettleResult(self._finish(stored), replayed=True)

    def _finish(self, operation: SettleOperation) -> dict[str, Any]:
        """An abort's compensation, begun by this operation and not yet done,
        is done now (first call or replay); then the creation as it stands."""
        identity = self._app.load(operation.identity_id, Identity)
        assert identity is not None
        tenure = identity.tenure(operation.tenure)
        mine = tenure.settle_operation_id == operation.operation_id
        if operation.action == ABORT and mine and tenure.phase == ABORTING:
            try:
                done = self._driver.abort_forcibly(identity.id, tenure.number, tenure.epoch)
            except Fenced:
                raise Conflict("another operation settled this creation since") from None
            identity, tenure = done.identity, done.tenure
        return {
            **parked_entry(identity, tenure),
            "action": operation.action,
            "operation_id": operation.operation_id,
        }
