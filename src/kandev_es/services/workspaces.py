"""Workspaces: open, load, resolve for a principal."""

from __future__ import annotations

import uuid

from eventsourcing.utils import get_topic

from kandev_es.application import Tasks, VersionConflict
from kandev_es.domain.errors import DomainRuleBroken
from kandev_es.domain.workspace import Workspace, workspace_id_for
from kandev_es.errors import BadRequest, Conflict, WorkspaceExists, WorkspaceNotFound
from kandev_es.storage.counters import advance_counter, ensure_counter
from kandev_es.storage.database import Database

# Bounds the walk over a name's deleted incarnations (each one a load).
MAX_INCARNATIONS = 1000
OPENED_TOPIC = get_topic(Workspace.Opened)


class WorkspaceService:
    def __init__(self, app: Tasks, database: Database) -> None:
        self._app = app
        self._database = database

    def open(self, name: str, task_prefix: str = "KAN") -> Workspace:
        incarnation = self._first_free(name)
        try:
            workspace = Workspace.open(name, task_prefix, incarnation)
        except DomainRuleBroken as error:
            raise BadRequest(str(error)) from None
        # The counter exists before the workspace does, so no create can miss it.
        ensure_counter(self._database, workspace.id)
        try:
            self._app.save_atomically(workspace)
        except VersionConflict:
            # Another open of this incarnation won: that workspace is live.
            raise WorkspaceExists(f"workspace {name!r} already exists") from None
        return workspace

    def _first_free(self, name: str) -> int:
        """The incarnation a new workspace of this name takes: past every deleted
        one. A live one means the name is taken."""
        for incarnation in range(MAX_INCARNATIONS):
            existing = self._app.load(workspace_id_for(name, incarnation), Workspace)
            if existing is None:
                return incarnation
            if not existing.deleted:
                raise WorkspaceExists(f"workspace {name!r} already exists")
        raise Conflict(f"workspace name {name!r} was deleted too often to be used again")

    def _live(self, name: str) -> Workspace | None:
        for incarnation in range(MAX_INCARNATIONS):
            existing = self._app.load(workspace_id_for(name, incarnation), Workspace)
            if existing is None:
                return None
            if not existing.deleted:
                return existing
        return None

    def get(self, workspace_id: uuid.UUID) -> Workspace | None:
        workspace = self._app.load(workspace_id, Workspace)
        if workspace is None or workspace.deleted:
            return None
        return workspace

    def list_live(self) -> list[Workspace]:
        """Every live workspace, oldest first: a scan of the notification log for
        workspace openings (few, rarely listed), then one read of them all."""
        found = self._app.read_many(self._app.originators(OPENED_TOPIC))
        return [w for w in found.values() if isinstance(w, Workspace) and not w.deleted]

    def set_wip_limit(self, workspace_id: uuid.UUID, limit: int | None) -> Workspace:
        def set_limit(workspace: Workspace | None) -> Workspace:
            if workspace is None:
                raise WorkspaceNotFound("workspace not found")
            try:
                workspace.set_wip_limit(limit)
            except DomainRuleBroken as error:
                raise BadRequest(str(error)) from None
            return workspace

        return self._app.retry_on_conflict(
            lambda: self.get(workspace_id), set_limit, contended="workspace is contended; retry"
        )

    def advance_numbers(
        self, by: int, only: uuid.UUID | None = None
    ) -> list[tuple[Workspace, int]]:
        """Move each live workspace's task numbering (or only ``only``'s) ``by``
        past the last number issued; each with the lowest number it issues next."""
        if by < 1:
            raise BadRequest("advance the numbering by at least 1")
        chosen = self.list_live() if only is None else [self.get(only)]
        if None in chosen:
            raise WorkspaceNotFound("workspace not found")
        return [(w, advance_counter(self._database, w.id, by)) for w in chosen if w]

    def get_by_name(self, name: str) -> Workspace | None:
        return self._live(name)

    def ensure(self, name: str, task_prefix: str = "KAN") -> tuple[Workspace, bool]:
        existing = self.get_by_name(name)
        if existing is not None:
            return existing, False
        try:
            return self.open(name, task_prefix), True
        except WorkspaceExists:
            again = self.get_by_name(name)
            assert again is not None
            return again, False

