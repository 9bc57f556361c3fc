"""The workspace WIP ledger: capacity reservations against the workspace's
limit. One stream per workspace, so the version check serialises reservations."""

from __future__ import annotations

import uuid

from eventsourcing.domain import Aggregate

from kandev_es.domain.errors import DomainRuleBroken

WIP_NAMESPACE = uuid.UUID("c7d1e4f2-3a6b-4c8d-9e0f-1a2b3c4d5e6f")


def wip_ledger_id(workspace_id: uuid.UUID) -> uuid.UUID:
    return uuid.uuid5(WIP_NAMESPACE, str(workspace_id))


class CapacityExhausted(DomainRuleBroken):
    pass


class WipLedger(Aggregate):
    class Opened(Aggregate.Created):
        workspace_id: uuid.UUID

    def __init__(self, workspace_id: uuid.UUID) -> None:
        self.workspace_id = workspace_id
        self.reserved: list[str] = []

    @classmethod
    def open(cls, workspace_id: uuid.UUID) -> WipLedger:
        return cls._create(cls.Opened, id=wip_ledger_id(workspace_id), workspace_id=workspace_id)

    def holds(self, task_id: uuid.UUID) -> bool:
        return str(task_id) in self.reserved

    def reserve(self, task_id: uuid.UUID, limit: int) -> None:
        if self.holds(task_id):
            return
        if len(self.reserved) >= limit:
            raise CapacityExhausted(f"workspace WIP limit {limit} reached")
        self.trigger_event(self.Reserved, task_id=task_id)

    def give_back(self, task_id: uuid.UUID) -> None:
        if self.holds(task_id):
            self.trigger_event(self.Returned, task_id=task_id)

    class Reserved(Aggregate.Event):
        task_id: uuid.UUID

        def apply(self, aggregate: WipLedger) -> None:
            aggregate.reserved.append(str(self.task_id))

    class Returned(Aggregate.Event):
        task_id: uuid.UUID

        def apply(self, aggregate: WipLedger) -> None:
            aggregate.reserved.remove(str(self.task_id))
