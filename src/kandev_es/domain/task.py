"""The Task aggregate: the work item a creation produces.

``revision`` counts caller-visible changes (field edits, archive, identity
release); it is what ETags and task.updated envelopes carry.
"""

from __future__ import annotations

import uuid
from typing import Any

from eventsourcing.domain import Aggregate

from kandev_es.domain.errors import DomainRuleBroken
from kandev_es.domain.events import DirectEvents, DirectInit

TASK_PREPARING = "preparing"
TASK_ACTIVE = "active"
TASK_ABORTED = "aborted"

EDITABLE_FIELDS = ("title", "description", "workflow_step")
# A task's free text: sealed in its events, gone once it is forgotten
# (docs/auditing.md: Erasure).
FORGETTABLE_FIELDS = ("title", "description")


class Task(DirectEvents, Aggregate):
    # True once forgotten (``forget``); None (left out of the DTO) before.
    forgotten: bool | None = None
    forgotten_by: str | None = None
    forget_operation_id: str | None = None
    class Created(DirectInit, Aggregate.Created):
        workspace_id: uuid.UUID
        identity_id: uuid.UUID
        identifier: str
        external_id: str | None
        title: str
        description: str
        workflow: str
        workflow_step: str
        parent_id: uuid.UUID | None
        repositories: list[str]
        attachments: list[str]
        start_agent: bool
        agent_profile: str | None
        created_by: str

    class CreatedActive(Created):
        """Created with its creation already completed: a plan without
        effects, claimed and completed in the save that creates the task
        (domain/creation.claim with completed=True). Stands for Created then Activated."""

        def mutate(self, aggregate: Any) -> Any:
            task = super().mutate(aggregate)
            assert isinstance(task, Task)
            task.phase = TASK_ACTIVE
            return task

    def __init__(
        self,
        workspace_id: uuid.UUID,
        identity_id: uuid.UUID,
        identifier: str,
        external_id: str | None,
        title: str,
        description: str,
        workflow: str,
        workflow_step: str,
        parent_id: uuid.UUID | None,
        repositories: list[str],
        attachments: list[str],
        start_agent: bool,
        agent_profile: str | None,
        created_by: str,
    ) -> None:
        self.workspace_id = workspace_id
        self.identity_id = identity_id
        self.identifier = identifier
        self.external_id = external_id
        self.title = title
        self.description = description
        self.workflow = workflow
        self.workflow_step = workflow_step
        self.parent_id = parent_id
        self.repositories = list(repositories)
        self.attachments = list(attachments)
        self.start_agent = start_agent
        self.agent_profile = agent_profile
        self.created_by = created_by
        self.phase = TASK_PREPARING
        self.revision = 1
        self.archived = False
        self.deleted = False

    @classmethod
    def create(cls, task_id: uuid.UUID, active: bool = False, **fields: Any) -> Task:
        """A preparing task; ``active``: one whose creation already completed."""
        return cls._create(cls.CreatedActive if active else cls.Created, id=task_id, **fields)

    # ----- commands ----------------------------------------------------------
    def activate(self, drop_external_id: bool) -> None:
        """The creation completed; the task becomes visible to feeds."""
        if self.phase != TASK_PREPARING:
            raise DomainRuleBroken("task creation already settled")
        self.trigger_event(self.Activated, external_id_dropped=drop_external_id)

    def abort_creation(self) -> None:
        """The creation was aborted and compensated: the task never existed for callers."""
        if self.phase != TASK_PREPARING:
            raise DomainRuleBroken("only a preparing task can be aborted")
        self.trigger_event(self.CreationAborted)

    def update(self, changes: dict[str, Any]) -> None:
        self._require_live()
        unknown = set(changes) - set(EDITABLE_FIELDS)
        if unknown:
            raise DomainRuleBroken(f"fields not editable: {sorted(unknown)}")
        if self.forgotten and set(changes) & set(FORGETTABLE_FIELDS):
            raise DomainRuleBroken("a forgotten task's free text is not written again")
        effective = {k: v for k, v in changes.items() if getattr(self, k) != v}
        if effective:
            self.trigger_event(self.Updated, changes=effective)

    def archive(self) -> None:
        self._require_live()
        if not self.archived:
            self.trigger_event(self.Archived)

    def clear_external_id(self, operation_id: str, reason: str) -> None:
        self._require_live()
        if self.external_id is not None:
            self.trigger_event(self.ExternalIdCleared, operation_id=operation_id, reason=reason)

    def delete(self) -> None:
        self._require_live()
        self.trigger_event(self.Deleted)

    def forget(
        self, operation_id: str, reason: str, actor: str, request_id: str | None = None,
        redactions: str | None = None,
    ) -> None:  # fmt: skip
        """Forget the task's free text (any task: a deleted one's events hold
        it too). ``reason`` is the operator's, never the erased values;
        ``redactions``: the statement of the cleartext events rewritten
        (erasure/redaction.py), hashes only."""
        if self.forgotten:
            raise DomainRuleBroken("task already forgotten")
        self.trigger_event(
            self.Forgotten, operation_id=operation_id, reason=reason, actor=actor,
            request_id=request_id, redactions=redactions,
        )  # fmt: skip

    def _require_live(self) -> None:
        if self.deleted or self.phase == TASK_ABORTED:
            raise DomainRuleBroken("task is deleted")

    # ----- events ------------------------------------------------------------
    class Activated(Aggregate.Event):
        external_id_dropped: bool

        def apply(self, aggregate: Task) -> None:
            aggregate.phase = TASK_ACTIVE
            if self.external_id_dropped:
                aggregate.external_id = None

    class CreationAborted(Aggregate.Event):
        def apply(self, aggregate: Task) -> None:
            aggregate.phase = TASK_ABORTED

    class Updated(Aggregate.Event):
        changes: dict[str, Any]

        def apply(self, aggregate: Task) -> None:
            for name, value in self.changes.items():
                setattr(aggregate, name, value)
            aggregate.revision += 1

    class Archived(Aggregate.Event):
        def apply(self, aggregate: Task) -> None:
            aggregate.archived = True
            aggregate.revision += 1

    class ExternalIdCleared(Aggregate.Event):
        operation_id: str
        reason: str

        def apply(self, aggregate: Task) -> None:
            aggregate.external_id = None
            aggregate.revision += 1

    class Deleted(Aggregate.Event):
        def apply(self, aggregate: Task) -> None:
            aggregate.deleted = True
            aggregate.revision += 1

    class Forgotten(Aggregate.Event):
        """Who forgot the task's free text, why, and by which request; no
        erased value. Its data key is deleted in the same save (erasure/)."""

        operation_id: str
        reason: str
        actor: str
        request_id: str | None = None
        # The redaction statement (erasure/redaction.py), a note the log's key
        # signed: for each event written before the upgrade that was rewritten,
        # its stream, version, logged chain hash and the hash of its new bytes.
        # None: nothing rewritten.
        redactions: str | None = None

        def apply(self, aggregate: Task) -> None:
            for name in FORGETTABLE_FIELDS:
                setattr(aggregate, name, None)
            aggregate.forgotten = True
            aggregate.forgotten_by = self.actor
            aggregate.forget_operation_id = self.operation_id
            aggregate.revision += 1
