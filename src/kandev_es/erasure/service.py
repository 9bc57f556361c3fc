"""Forget a task (``kandev-es task forget``, POST /api/v1/tasks/<id>/forget):
in one save, the task's and its identity's ``Forgotten`` events, its data key
deleted (storage/sealing.py: its sealed events then read as forgotten), its
read-model rows rewritten by the inline views, and its earlier feed rows
rewritten without its free text; with them, the file names of the uploads it
claimed (each upload's ``Forgotten`` event, its own key deleted). A task's
events written before the upgrade (cleartext, format 0) are rewritten with
their free text null under a redaction statement the Forgotten events record
(erasure/redaction.py). By stable operation id (Idempotency-Key)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kandev_es_client.signed_note import Signer

from kandev_es.application import Tasks, VersionConflict
from kandev_es.domain.attachment import Attachment, attachment_id_for
from kandev_es.domain.identity import Identity
from kandev_es.domain.principal import Principal
from kandev_es.domain.release import validate_operation_id
from kandev_es.domain.task import FORGETTABLE_FIELDS, Task
from kandev_es.erasure import redaction
from kandev_es.erasure.redaction import Rewrite
from kandev_es.errors import (
    Contended,
    OperatorRequired,
    TaskNotFound,
    ValidationFailed,
)
from kandev_es.observability.serving import current_request_id
from kandev_es.storage.database import Database

ATTEMPTS = 8
# What the webhook delivery log shows of an answer to a forgotten task's event.
FORGOTTEN_ANSWER = "(forgotten with its task)"
MAX_REASON = 500


@dataclass(frozen=True)
class ForgetResult:
    body: dict[str, Any]
    replayed: bool


def validate_reason(raw: object) -> str:
    """Why (the operator's words, e.g. "GDPR art. 17 request 2026-118"):
    1-500 characters, stored in the Forgotten event, so never the erased values."""
    if not isinstance(raw, str) or not raw.strip():
        raise ValidationFailed("a reason is required", field="reason")
    if len(raw) > MAX_REASON or any(ord(c) < 32 and c not in "\t" for c in raw):
        raise ValidationFailed(
            f"the reason is at most {MAX_REASON} characters, one line", field="reason"
        )
    return raw.strip()


class ForgetService:
    def __init__(
        self, app: Tasks, database: Database, signer: Callable[[], Signer]
    ) -> None:
        """``signer``: the log's key (the sequencer's), which signs the
        redaction statement of a task written before the upgrade."""
        self._app = app
        self._database = database
        self._signer = signer

    def forget(
        self, principal: Principal | None, task_id: uuid.UUID, raw_reason: object,
        raw_operation_id: str | None,
    ) -> ForgetResult:  # fmt: skip
        self._authorized(principal, task_id)  # authorization precedes validation: 404 first
        operation_id = validate_operation_id(raw_operation_id)
        reason = validate_reason(raw_reason)
        for _ in range(ATTEMPTS):
            task = self._authorized(principal, task_id)
            identity = self._app.load(task.identity_id, Identity)
            found = self._cleartext(task, identity)
            if task.forgotten:  # what a first forget left undone (it stopped), only that
                named = redaction.named(self._app.recorder.select_events(task_id))
                self._rewrite([r for r in found if (r.stream, r.version) in named])
                return ForgetResult(answer(task, None), replayed=True)
            entries = redaction.statement(self._database, found)
            note = redaction.signed(self._signer(), task_id, entries) if entries else None
            assert principal is not None  # _authorized refused everyone else
            request_id = current_request_id()
            task.forget(operation_id, reason, principal.actor, request_id, note)
            if identity is not None:
                own = any(e.stream == identity.id for e in entries)
                identity.forget_task(task_id, operation_id, request_id, note if own else None)
            attachments = self._attachments(task)
            keys = [task_id, *(attachment.id for attachment in attachments)]
            views: dict[str, list[tuple[Any, ...]]] = {
                "task_keys_gone": [(str(key),) for key in keys],
                **self._feed_rewrites(task_id),
            }
            saved = [a for a in (task, identity, *attachments) if a and a.pending_events]
            try:
                self._app.save_atomically(*saved, extra_views=views)
            except VersionConflict:
                continue  # the task, identity or an attachment moved on: read again
            self._rewrite(found)
            return ForgetResult(answer(task, reason), replayed=False)
        raise Contended("the task keeps changing; retry with the same Idempotency-Key")

    def _authorized(self, principal: Principal | None, task_id: uuid.UUID) -> Task:
        """Any task, deleted ones too (their events hold free text as well);
        one outside the caller's workspaces is not found (never revealed)."""
        task = self._app.load(task_id, Task)
        if task is None or principal is None or not principal.may_act_on(task.workspace_id):
            raise TaskNotFound("task not found")
        if not principal.is_operator_of(task.workspace_id):
            raise OperatorRequired("forgetting a task needs an operator or admin token")
        return task

    def _cleartext(self, task: Task, identity: Identity | None) -> list[Rewrite]:
        """The task's events written in cleartext (before the upgrade) that
        still hold its free text -- and the uploads it claimed, their file
        names -- with what each becomes."""
        uploads = [attachment.id for attachment in self._claimed(task)]
        stored = [
            event
            for stream in [*redaction.streams_of(task.id, identity), *uploads]
            for event in self._app.recorder.select_events(stream)
        ]
        return redaction.rewrites({task.id, *uploads}, stored)

    def _claimed(self, task: Task) -> list[Attachment]:
        """The uploads the task claimed."""
        found = []
        for sha in task.attachments or ():
            attachment = self._app.load(attachment_id_for(task.workspace_id, sha), Attachment)
            if attachment is not None and attachment.claimed_by == task.id:
                found.append(attachment)
        return found

    def _rewrite(self, found: list[Rewrite]) -> None:
        """Rewrite them, after the save that recorded their statement (only a
        forgotten task's; compare-and-set, so a replay finishes a first
        forget that stopped between the two and changes nothing else)."""
        if found:
            table = self._app.recorder.events_table_name  # type: ignore[attr-defined]
            redaction.apply(self._database, table, found)

    def _attachments(self, task: Task) -> list[Attachment]:
        """The uploads the task claimed, each with its ``Forgotten`` event
        pending: their file names are sealed under keys of their own
        (storage/sealing.py), deleted in the same save."""
        found = self._claimed(task)
        for attachment in found:
            attachment.forget(task.id)
        return found

    def _feed_rewrites(self, task_id: uuid.UUID) -> dict[str, list[tuple[int, str]]]:
        """The task's feed rows (JSON feed, SSE replay, webhooks read them),
        each with its DTO's free text as a rebuild makes it: null; and the
        webhook delivery log's answers to them blanked (a receiver's answer
        may echo what it got)."""
        subject: Any = task_id if self._database.backend == "postgres" else str(task_id)
        with self._database.transaction() as tx:
            rows = tx.execute(
                "SELECT position, data FROM feed_events WHERE subject = ?", (subject,)
            )
        rewritten = []
        for position, data in rows:
            dto = json.loads(data)
            if any(dto.get(name) is not None for name in FORGETTABLE_FIELDS):
                dto.update(dict.fromkeys(FORGETTABLE_FIELDS))
                rewritten.append((int(position), json.dumps(dto)))
        answers = [(int(position), FORGOTTEN_ANSWER) for position, _ in rows]
        return {"feed_forgotten": rewritten, "deliveries_forgotten": answers}


def answer(task: Task, reason: str | None) -> dict[str, Any]:
    """What a forget answers: the task's id and the operation that forgot it
    (a replay: the first operation's id and actor; its reason is in the event)."""
    body: dict[str, Any] = {
        "task_id": str(task.id),
        "forgotten": True,
        "operation_id": task.forget_operation_id,
        "actor": task.forgotten_by,
        "revision": task.revision,
    }
    if reason is not None:
        body["reason"] = reason
    return body
