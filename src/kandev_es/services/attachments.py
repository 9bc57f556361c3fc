"""Attachment uploads: content-addressed blobs on disk, one aggregate each."""

from __future__ import annotations

import hashlib
import os
import tempfile
import uuid
from typing import Any

from kandev_es.application import Tasks, VersionConflict
from kandev_es.config import Settings, data_path
from kandev_es.domain.attachment import Attachment, attachment_id_for
from kandev_es.errors import ValidationFailed


def attachment_dto(attachment: Attachment) -> dict[str, Any]:
    return {
        "id": f"sha256:{attachment.sha256}",
        "sha256": attachment.sha256,
        "filename": attachment.filename,
        "size": attachment.size,
        "content_type": attachment.content_type,
        "claimed_by": str(attachment.claimed_by) if attachment.claimed_by else None,
    }


class AttachmentService:
    def __init__(self, app: Tasks, settings: Settings) -> None:
        self._app = app
        self._settings = settings

    def upload(
        self, workspace_id: uuid.UUID, filename: str, content: bytes, content_type: str
    ) -> dict[str, Any]:
        if not filename or len(filename) > 255 or "/" in filename or "\x00" in filename:
            raise ValidationFailed("filename must be 1-255 characters without '/'")
        sha = hashlib.sha256(content).hexdigest()
        blob = data_path(self._settings, "blobs", sha[:2], sha)
        if not blob.exists():
            blob.parent.mkdir(parents=True, exist_ok=True)
            # Write then rename: a blob on disk is always complete.
            fd, temporary = tempfile.mkstemp(dir=blob.parent)
            with os.fdopen(fd, "wb") as handle:
                handle.write(content)
            os.replace(temporary, blob)
        existing = self._app.load(attachment_id_for(workspace_id, sha), Attachment)
        if existing is not None:
            return attachment_dto(existing)
        attachment = Attachment.upload(workspace_id, sha, filename, len(content), content_type)
        try:
            self._app.save_atomically(attachment)
        except VersionConflict:
            again = self._app.load(attachment.id, Attachment)
            assert again is not None
            return attachment_dto(again)
        return attachment_dto(attachment)

    def get(self, workspace_id: uuid.UUID, reference: str) -> Attachment | None:
        sha = reference.removeprefix("sha256:")
        return self._app.load(attachment_id_for(workspace_id, sha), Attachment)
