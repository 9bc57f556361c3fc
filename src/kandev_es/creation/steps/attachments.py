"""Attachment claim: an uploaded blob becomes owned by exactly one task."""

from __future__ import annotations

from typing import Any

from kandev_es.creation.steps.base import (
    SHARED_ATTEMPTS,
    SHARED_CONTENDED,
    StepContext,
    StepFailed,
)
from kandev_es.domain.attachment import Attachment, attachment_id_for
from kandev_es.domain.errors import DomainRuleBroken
from kandev_es.errors import AttachmentClaimed, Contended, UnknownReference


class AttachmentClaimStep:
    def __init__(self, sha256: str) -> None:
        self.sha256 = sha256
        self.name = f"attachment:{sha256}"

    def _load(self, ctx: StepContext) -> Attachment | None:
        return ctx.app.load(attachment_id_for(ctx.workspace_id, self.sha256), Attachment)

    def _require(self, ctx: StepContext) -> Attachment:
        attachment = self._load(ctx)
        if attachment is None:
            raise StepFailed(UnknownReference("attachment not uploaded", field="attachments"))
        return attachment

    def run(self, ctx: StepContext) -> dict[str, Any]:
        def claim(attachment: Attachment) -> None:
            attachment.claim(ctx.task_id)

        ctx.fence()  # held still? an owner that lost its lease makes nothing

        try:
            ctx.app.retry_on_conflict(
                lambda: self._require(ctx), claim, attempts=SHARED_ATTEMPTS,
                contended=SHARED_CONTENDED,
            )
        except DomainRuleBroken:
            raise StepFailed(
                AttachmentClaimed("attachment is claimed by another task", sha256=self.sha256)
            ) from None
        except Contended as error:
            raise StepFailed(error) from None
        return {"sha256": self.sha256, "claimed_by": str(ctx.task_id)}

    def reconcile(self, ctx: StepContext) -> dict[str, Any] | None:
        attachment = self._load(ctx)
        if attachment is None or attachment.claimed_by != ctx.task_id:
            return None
        return {"sha256": self.sha256, "claimed_by": str(ctx.task_id)}

    def compensate(self, ctx: StepContext) -> None:
        if self._load(ctx) is None:
            return
        ctx.app.retry_on_conflict(
            lambda: self._require(ctx), lambda a: a.release_claim(ctx.task_id),
            attempts=SHARED_ATTEMPTS, contended=SHARED_CONTENDED,
        )

    def absent(self, ctx: StepContext) -> bool:
        return self.reconcile(ctx) is None
