"""An agent session: the durable record that a task has an agent run, with the
run id the agent's credential is bound to."""

from __future__ import annotations

import uuid

from eventsourcing.domain import Aggregate

SESSION_NAMESPACE = uuid.UUID("e2a4c6b8-0d1f-4a3b-8c5d-7e9f1a3b5c7d")


def session_id_for(task_id: uuid.UUID) -> uuid.UUID:
    return uuid.uuid5(SESSION_NAMESPACE, str(task_id))


class AgentSession(Aggregate):
    class Opened(Aggregate.Created):
        task_id: uuid.UUID
        workspace_id: uuid.UUID
        profile: str

    def __init__(self, task_id: uuid.UUID, workspace_id: uuid.UUID, profile: str) -> None:
        self.task_id = task_id
        self.workspace_id = workspace_id
        self.profile = profile
        self.closed = False

    @classmethod
    def open(cls, task_id: uuid.UUID, workspace_id: uuid.UUID, profile: str) -> AgentSession:
        return cls._create(
            cls.Opened,
            id=session_id_for(task_id),
            task_id=task_id,
            workspace_id=workspace_id,
            profile=profile,
        )

    @property
    def run_id(self) -> str:
        return str(self.id)

    def close(self, reason: str) -> None:
        if not self.closed:
            self.trigger_event(self.Closed, reason=reason)

    class Closed(Aggregate.Event):
        reason: str

        def apply(self, aggregate: AgentSession) -> None:
            aggregate.closed = True
