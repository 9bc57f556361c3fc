"""Task reads and edits after creation: get, list, patch, archive, delete."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from marshmallow import RAISE, Schema, ValidationError, fields, validate

from kandev_es.application import Tasks
from kandev_es.domain.identity import Identity
from kandev_es.domain.principal import Principal
from kandev_es.domain.task import FORGETTABLE_FIELDS, TASK_ABORTED, TASK_PREPARING, Task
from kandev_es.domain.token import ApiToken, end_run, run_credential_id_of_task
from kandev_es.domain.wip import WipLedger, wip_ledger_id
from kandev_es.domain.workspace import Workspace
from kandev_es.errors import (
    CreationInProgress,
    ExternalIdImmutable,
    OperatorRequired,
    RevisionMismatch,
    TaskForgotten,
    TaskNotFound,
    ValidationFailed,
)
from kandev_es.observability.serving import current_request_id
from kandev_es.storage.database import Database
from kandev_es.views import task_dto

EDITED = "task is being edited concurrently; retry"


class TaskPatchSchema(Schema):
    class Meta:
        unknown = RAISE

    title = fields.String(validate=validate.Length(min=1, max=500))
    description = fields.String(validate=validate.Length(max=100_000))
    workflow_step = fields.String(validate=validate.Length(min=1, max=100))


@dataclass(frozen=True)
class TaskPage:
    """One page of a workspace's task list, as every entry point answers it."""

    items: list[dict[str, Any]]
    next_cursor: int | None  # pass back as ``after``; None on the last page

    @property
    def has_more(self) -> bool:
        return self.next_cursor is not None

    def to_dict(self) -> dict[str, Any]:
        return {"items": self.items, "next_cursor": self.next_cursor, "has_more": self.has_more}


class TaskService:
    def __init__(self, app: Tasks, database: Database) -> None:
        self._app = app
        self._database = database

    def get(self, principal: Principal | None, task_id: uuid.UUID) -> Task:
        task = self._app.load(task_id, Task)
        if task is None or task.deleted or task.phase == TASK_ABORTED or principal is None:
            raise TaskNotFound("task not found")
        if not principal.may_act_on(task.workspace_id):
            raise TaskNotFound("task not found")
        return task

    def list(
        self,
        workspace_id: uuid.UUID,
        *,
        external_id: str | None = None,
        after: int = 0,
        limit: int = 50,
        include_archived: bool = True,
    ) -> TaskPage:
        """From the tasks read model: may lag the event store by the projection delay."""
        sql = "SELECT position, dto FROM tasks_view WHERE workspace_id = ? AND position > ?"
        params: list[Any] = [_db_id(self._database, workspace_id), after]
        if external_id is not None:
            sql += " AND external_id = ?"
            params.append(external_id)
        if not include_archived:
            sql += " AND archived = ?"
            params.append(False)
        sql += " ORDER BY position LIMIT ?"
        params.append(limit + 1)
        with self._database.transaction() as tx:
            rows = tx.execute(sql, params)
        items = [json.loads(dto) for _, dto in rows[:limit]]
        next_cursor = int(rows[limit - 1][0]) if len(rows) > limit else None
        return TaskPage(items, next_cursor)

    def patch(
        self,
        principal: Principal | None,
        task_id: uuid.UUID,
        body: Mapping[str, Any],
        if_revision: int | None = None,
    ) -> dict[str, Any]:
        self.get(principal, task_id)  # authorization precedes validation: 404 first
        if "external_id" in body:
            raise ExternalIdImmutable("external_id cannot be changed after creation")
        try:
            changes: dict[str, Any] = TaskPatchSchema().load(dict(body))
        except ValidationError as error:
            raise ValidationFailed("invalid task update", fields=error.messages) from None

        def update(task: Task) -> Task:
            if task.forgotten and set(changes) & set(FORGETTABLE_FIELDS):
                raise TaskForgotten("this task was forgotten: its free text is not written again")
            if "workflow_step" in changes:
                workspace = self._app.load(task.workspace_id, Workspace)
                steps = workspace.workflows.get(task.workflow, []) if workspace else []
                if changes["workflow_step"] not in steps:
                    raise ValidationFailed("unknown workflow step", field="workflow_step")
            task.update(changes)
            return task

        edited = self._app.retry_on_conflict(
            lambda: self._editable(principal, task_id, if_revision), update, contended=EDITED
        )
        return task_dto(edited)

    def archive(self, principal: Principal | None, task_id: uuid.UUID) -> dict[str, Any]:
        """Archiving ends the task's run: its credential is revoked in the same save."""

        def load() -> tuple[Task, WipLedger | None, ApiToken | None]:
            task = self._editable(principal, task_id, None)
            return task, self._wip_ledger(task), self._run_credential(task)

        def archive(loaded: tuple[Task, WipLedger | None, ApiToken | None]) -> Task:
            task, ledger, credential = loaded
            task.archive()
            _give_back_wip(ledger, task)
            end_run(credential, "task_archived")
            return task

        return task_dto(self._app.retry_on_conflict(load, archive, contended=EDITED))

    def delete(self, principal: Principal | None, task_id: uuid.UUID) -> None:
        """Deleting a task frees its identity and revokes its run's credential in
        the same atomic save."""

        Loaded = tuple[Task, Identity | None, WipLedger | None, ApiToken | None]

        def load() -> Loaded:
            task = self._editable(principal, task_id, None)
            # Deleting frees the identity, like a release: an operator's action.
            if principal is None or not principal.is_operator_of(task.workspace_id):
                raise OperatorRequired("deleting a task needs an operator token")
            identity = self._app.load(task.identity_id, Identity)
            return task, identity, self._wip_ledger(task), self._run_credential(task)

        def delete(loaded: Loaded) -> Task:
            task, identity, ledger, credential = loaded
            assert principal is not None  # load refused everyone else
            holder = identity.holder if identity else None
            if identity is not None and holder is not None and holder.task_id == task.id:
                identity.release(
                    holder.number, f"task-delete:{task.id}", "task_deleted",
                    actor=principal.actor, request_id=current_request_id(),
                )
            task.delete()
            _give_back_wip(ledger, task)
            end_run(credential, "task_deleted")
            return task

        self._app.retry_on_conflict(load, delete, contended=EDITED)

    def _run_credential(self, task: Task) -> ApiToken | None:
        return self._app.load(run_credential_id_of_task(task.id), ApiToken)

    def _wip_ledger(self, task: Task) -> WipLedger | None:
        return self._app.load(wip_ledger_id(task.workspace_id), WipLedger)

    def _editable(
        self, principal: Principal | None, task_id: uuid.UUID, if_revision: int | None
    ) -> Task:
        task = self.get(principal, task_id)
        if task.phase == TASK_PREPARING:
            raise CreationInProgress("task creation has not finished; it cannot be changed")
        if if_revision is not None and task.revision != if_revision:
            raise RevisionMismatch(
                "task revision changed", expected=if_revision, actual=task.revision
            )
        return task


def _give_back_wip(ledger: WipLedger | None, task: Task) -> None:
    """An archived or deleted task no longer counts against the WIP limit: the
    slot returns in the same atomic save."""
    if ledger is not None and ledger.holds(task.id):
        ledger.give_back(task.id)


def _db_id(database: Database, value: uuid.UUID) -> Any:
    return value if database.backend == "postgres" else str(value)
