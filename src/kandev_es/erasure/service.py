"""Forget a task (``kandev-es task forget``, POST /api/v1/tasks/<id>/forget):
in one save, the task's and its identity's ``Forgotten`` events, its data key
deleted (storage/sealing.py: its sealed events then read as forgotten), its
read-model rows rewritten by the inline views, and its earlier feed rows
rewritten without its free text. By stable operation id (Idempotency-Key)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from kandev_es.application import Tasks, VersionConflict
from kandev_es.domain.identity import Identity
from kandev_es.domain.principal import Principal
from kandev_es.domain.release import validate_operation_id
from kandev_es.domain.task import FORGETTABLE_FIELDS, Task
from kandev_es.errors import (
    Contended,
    OperatorRequired,
    TaskNotFound,
    TaskNotSealed,
    ValidationFailed,
)
from kandev_es.observability.serving import current_request_id
from kandev_es.storage.database import Database
from kandev_es.storage.sealing import SEALED

ATTEMPTS = 8
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
    def __init__(self, app: Tasks, database: Database) -> None:
        self._app = app
        self._database = database

    def forget(
        self, principal: Principal | None, task_id: uuid.UUID, raw_reason: object,
        raw_operation_id: str | None,
    ) -> ForgetResult:  # fmt: skip
        self._authorized(principal, task_id)  # authorization precedes validation: 404 first
        operation_id = validate_operation_id(raw_operation_id)
        reason = validate_reason(raw_reason)
        for _ in range(ATTEMPTS):
            task = self._authorized(principal, task_id)
            if task.forgotten:
                return ForgetResult(answer(task, None), replayed=True)
            self._require_sealed(task_id)
            identity = self._app.load(task.identity_id, Identity)
            assert principal is not None  # _authorized refused everyone else
            request_id = current_request_id()
            task.forget(operation_id, reason, principal.actor, request_id)
            if identity is not None:
                identity.forget_task(task_id, operation_id, request_id)
            views: dict[str, list[tuple[Any, ...]]] = {
                "task_keys_gone": [(str(task_id),)],
                "feed_forgotten": self._feed_rewrites(task_id),
            }
            saved = [a for a in (task, identity) if a is not None and a.pending_events]
            try:
                self._app.save_atomically(*saved, extra_views=views)
            except VersionConflict:
                continue  # the task or identity moved on: read again
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

    def _require_sealed(self, task_id: uuid.UUID) -> None:
        """A task created before the upgrade holds its free text in cleartext
        events, which forgetting cannot change (docs/auditing.md: Erasure)."""
        stored = list(self._app.recorder.select_events(task_id, limit=1))
        if not stored or SEALED not in json.loads(stored[0].state):
            raise TaskNotSealed(
                "this task was created before free text was sealed (event format 0):"
                " its events hold it in cleartext, so forgetting it would leave it in"
                " the store; see docs/auditing.md: Erasure"
            )

    def _feed_rewrites(self, task_id: uuid.UUID) -> list[tuple[int, str]]:
        """The task's feed rows (JSON feed, SSE replay, webhooks read them),
        each with its DTO's free text as a rebuild makes it: null."""
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
        return rewritten


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
