"""Workspace-policy write: reserve one WIP slot against the workspace's limit."""

from __future__ import annotations

from typing import Any

from kandev_es.creation.steps.base import (
    SHARED_ATTEMPTS,
    SHARED_CONTENDED,
    StepContext,
    StepFailed,
)
from kandev_es.domain.wip import CapacityExhausted, WipLedger, wip_ledger_id
from kandev_es.errors import CapacityExceeded, Contended


class WipReservationStep:
    name = "policy:wip"

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def _load(self, ctx: StepContext) -> WipLedger:
        ledger = ctx.app.load(wip_ledger_id(ctx.workspace_id), WipLedger)
        return ledger or WipLedger.open(ctx.workspace_id)

    def run(self, ctx: StepContext) -> dict[str, Any]:
        def reserve(ledger: WipLedger) -> WipLedger:
            ledger.reserve(ctx.task_id, self.limit)
            return ledger

        ctx.fence()  # held still? an owner that lost its lease makes nothing

        try:
            ledger = ctx.app.retry_on_conflict(
                lambda: self._load(ctx), reserve, attempts=SHARED_ATTEMPTS,
                contended=SHARED_CONTENDED,
            )
        except CapacityExhausted as error:
            raise StepFailed(CapacityExceeded(str(error), wip_limit=self.limit)) from None
        except Contended as error:
            raise StepFailed(error) from None
        return {"ledger": str(ledger.id), "limit": self.limit, "in_use": len(ledger.reserved)}

    def reconcile(self, ctx: StepContext) -> dict[str, Any] | None:
        ledger = ctx.app.load(wip_ledger_id(ctx.workspace_id), WipLedger)
        if ledger is None or not ledger.holds(ctx.task_id):
            return None
        return {"ledger": str(ledger.id), "limit": self.limit, "in_use": len(ledger.reserved)}

    def compensate(self, ctx: StepContext) -> None:
        if ctx.app.load(wip_ledger_id(ctx.workspace_id), WipLedger) is None:
            return
        ctx.app.retry_on_conflict(
            lambda: self._load(ctx), lambda ledger: ledger.give_back(ctx.task_id),
            attempts=SHARED_ATTEMPTS, contended=SHARED_CONTENDED,
        )

    def absent(self, ctx: StepContext) -> bool:
        return self.reconcile(ctx) is None
