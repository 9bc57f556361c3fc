"""Workspace deletion (AC-6): mark the workspace deleted (a new deletion
generation), fence every creation still in flight, record workspace_deleted
with that generation, clear every identity, then remove the live task rows.
Identity streams stay for auditors."""

from __future__ import annotations

import contextlib
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from kandev_es.application import Tasks, VersionConflict
from kandev_es.config import Settings
from kandev_es.creation.driver import CreationDriver, Fenced
from kandev_es.domain.errors import DomainRuleBroken
from kandev_es.domain.identity import COMPLETED, PREPARING, Identity
from kandev_es.domain.task import Task
from kandev_es.domain.token import ApiToken, end_run, run_credential_id_of_task
from kandev_es.domain.workspace import Workspace
from kandev_es.errors import Conflict, WorkspaceNotFound
from kandev_es.observability.serving import current_request_id
from kandev_es.projections.runner import ProjectionRunner
from kandev_es.storage.database import Database

ATTEMPTS = 16


class WorkspaceDeletionService:
    def __init__(
        self,
        app: Tasks,
        database: Database,
        projections: ProjectionRunner,
        settings: Settings,
        driver: CreationDriver,
    ) -> None:
        self._app = app
        self._database = database
        self._projections = projections
        self._driver = driver
        self._lease = timedelta(seconds=settings.lease_seconds)

    def delete(self, workspace_id: uuid.UUID, *, actor: str) -> dict[str, Any]:
        """``actor`` (who deletes) goes on every Released event this records."""
        generation = self._mark_deleted(workspace_id)
        # Every task written before the mark is in the read model after this.
        self._projections.catch_up()
        removed = 0
        for task_id in self._task_ids(workspace_id):
            removed += self._clear(task_id, generation, actor)
        return {
            "workspace_id": str(workspace_id),
            "deletion_generation": generation,
            "tasks_removed": removed,
        }

    def _mark_deleted(self, workspace_id: uuid.UUID) -> int:
        def delete(workspace: Workspace | None) -> int:
            if workspace is None or workspace.deleted:
                raise WorkspaceNotFound("workspace not found")
            return workspace.delete()

        return self._app.retry_on_conflict(
            lambda: self._app.load(workspace_id, Workspace), delete,
            contended="workspace is contended; retry",
        )

    def _task_ids(self, workspace_id: uuid.UUID) -> list[uuid.UUID]:
        key: Any = workspace_id if self._database.backend == "postgres" else str(workspace_id)
        with self._database.transaction() as tx:
            rows = tx.execute("SELECT task_id FROM tasks_view WHERE workspace_id = ?", (key,))
        return [uuid.UUID(str(row[0])) for row in rows]

    def _clear(self, task_id: uuid.UUID, generation: int, actor: str) -> int:
        operation = f"workspace-delete:{generation}"
        fenced = False
        for _ in range(ATTEMPTS):
            task = self._app.load(task_id, Task)
            # The run's credential ends with its task: in the task's save below,
            # or on its own when the task had ended already (deleted, or aborted
            # with a compensation that revoked it: then no write).
            credential = self._app.load(run_credential_id_of_task(task_id), ApiToken)
            end_run(credential, "workspace_deleted")
            ended = (credential,) if credential is not None and credential.pending_events else ()
            try:
                if task is None or task.deleted or task.phase == "aborted":
                    if ended:
                        self._app.save_atomically(*ended)
                    # A creation this deletion fenced and aborted counts as removed.
                    return 1 if fenced else 0
                identity = self._app.load(task.identity_id, Identity)
                assert identity is not None
                tenure = next(t for t in identity.tenures.values() if t.task_id == task_id)
                if tenure.in_flight:
                    self._fence_and_settle(identity, tenure.number, operation, generation, actor)
                    fenced = True
                    continue  # re-read: it is settled now
                if tenure.phase == COMPLETED and tenure.holds:
                    identity.release(
                        tenure.number, operation, "workspace_deleted", generation, actor=actor,
                        request_id=current_request_id(),
                    )
                task.delete()
                self._app.save_atomically(identity, task, *ended)
                return 1
            except VersionConflict:
                continue
        raise Conflict("workspace deletion is contended; retry")

    def _fence_and_settle(
        self, identity: Identity, number: int, operation: str, generation: int, actor: str
    ) -> None:
        tenure = identity.tenure(number)
        epoch = identity.recover(number, operation, datetime.now(UTC) + self._lease)
        if tenure.phase == PREPARING:
            # Also when an operator already released it: the generation is recorded.
            identity.record_workspace_deletion(
                number, operation, generation, actor=actor, request_id=current_request_id()
            )
        self._app.save_atomically(identity)
        # Preparing aborts (the workspace is deleted); completing completes. If
        # someone newer acts on it instead, the next pass re-reads.
        with contextlib.suppress(Fenced, DomainRuleBroken):
            self._driver.drive(identity.id, number, epoch)
