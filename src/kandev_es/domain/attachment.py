"""Uploaded attachments: a content-addressed blob that exactly one task may claim."""

from __future__ import annotations

import uuid

from eventsourcing.domain import Aggregate

from kandev_es.domain.errors import DomainRuleBroken

ATTACHMENT_NAMESPACE = uuid.UUID("5b0e2c8a-1f4d-4e7a-b6c3-9d8e7f6a5b41")


def attachment_id_for(workspace_id: uuid.UUID, sha256: str) -> uuid.UUID:
    return uuid.uuid5(ATTACHMENT_NAMESPACE, f"{workspace_id}\x00{sha256}")


class Attachment(Aggregate):
    class Uploaded(Aggregate.Created):
        workspace_id: uuid.UUID
        sha256: str
        filename: str
        size: int
        content_type: str

    def __init__(
        self, workspace_id: uuid.UUID, sha256: str, filename: str, size: int, content_type: str
    ) -> None:
        self.workspace_id = workspace_id
        self.sha256 = sha256
        # None once forgotten (or its data key lost: storage/sealing.py).
        self.filename: str | None = filename
        self.size = size
        self.content_type = content_type
        self.claimed_by: uuid.UUID | None = None
        self.forgotten = False

    @classmethod
    def upload(
        cls, workspace_id: uuid.UUID, sha256: str, filename: str, size: int, content_type: str
    ) -> Attachment:
        return cls._create(
            cls.Uploaded,
            id=attachment_id_for(workspace_id, sha256),
            workspace_id=workspace_id,
            sha256=sha256,
            filename=filename,
            size=size,
            content_type=content_type,
        )

    def claim(self, task_id: uuid.UUID) -> None:
        if self.claimed_by == task_id:
            return
        if self.claimed_by is not None:
            raise DomainRuleBroken("attachment is claimed by another task")
        self.trigger_event(self.Claimed, task_id=task_id)

    def forget(self, task_id: uuid.UUID) -> None:
        """Its file name erased with the task that claimed it (erasure/): its
        data key is deleted in the same save, so the sealed name reads as None."""
        if not self.forgotten:
            self.trigger_event(self.Forgotten, task_id=task_id)

    def release_claim(self, task_id: uuid.UUID) -> None:
        if self.claimed_by == task_id:
            self.trigger_event(self.ClaimReleased, task_id=task_id)

    class Claimed(Aggregate.Event):
        task_id: uuid.UUID

        def apply(self, aggregate: Attachment) -> None:
            aggregate.claimed_by = self.task_id

    class ClaimReleased(Aggregate.Event):
        task_id: uuid.UUID

        def apply(self, aggregate: Attachment) -> None:
            aggregate.claimed_by = None

    class Forgotten(Aggregate.Event):
        """Its file name was forgotten with the task that claimed it: which
        task, never the name."""

        task_id: uuid.UUID

        def apply(self, aggregate: Attachment) -> None:
            aggregate.filename = None
            aggregate.forgotten = True
