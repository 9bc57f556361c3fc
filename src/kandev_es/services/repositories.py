"""Repositories registered to a workspace: real local git repositories that
creations branch and check out worktrees from."""

from __future__ import annotations

import uuid
from pathlib import Path

from kandev_es.application import Tasks
from kandev_es.creation.steps.git import is_repository, is_work_tree_top
from kandev_es.domain.errors import DomainRuleBroken
from kandev_es.domain.workspace import REPOSITORY_NAME_PATTERN, Workspace
from kandev_es.errors import Conflict, RepositoryNotTopLevel, ValidationFailed, WorkspaceNotFound
from kandev_es.limits import check_repository_path


class RepositoryService:
    def __init__(self, app: Tasks, roots: tuple[Path, ...]) -> None:
        self._app = app
        self._roots = roots  # resolved (config.Settings.allowed_repository_roots)

    def register(self, workspace_id: uuid.UUID, name: str, path: str) -> dict[str, str]:
        if not isinstance(name, str) or not REPOSITORY_NAME_PATTERN.fullmatch(name):
            raise ValidationFailed("repository name must be letters, digits, '_', '.', '-'")
        given = Path(path)
        if not given.is_absolute():
            raise ValidationFailed("path must be an absolute path", field="path")
        resolved = check_repository_path(given, self._roots)
        if not resolved.is_dir() or not is_repository(resolved):
            raise ValidationFailed(
                "path must be an absolute path to a local git repository with a commit",
                field="path",
            )
        if not is_work_tree_top(resolved):
            raise RepositoryNotTopLevel(
                "path must be the top of its own git work tree, not a folder inside another"
                " repository",
                field="path",
            )

        def add(workspace: Workspace | None) -> dict[str, str]:
            if workspace is None or workspace.deleted:
                raise WorkspaceNotFound("workspace not found")
            try:
                workspace.register_repository(name, str(resolved))
            except DomainRuleBroken as error:
                raise Conflict(str(error)) from None
            return {"name": name, "path": str(resolved)}

        return self._app.retry_on_conflict(
            lambda: self._app.load(workspace_id, Workspace), add,
            contended="workspace is contended; retry",
        )

    def list(self, workspace_id: uuid.UUID, *, with_paths: bool) -> list[dict[str, str]]:
        """The workspace's repositories; their server paths only ``with_paths``
        (an operator or admin): a member needs the names to create."""
        workspace = self._app.load(workspace_id, Workspace)
        if workspace is None or workspace.deleted:
            raise WorkspaceNotFound("workspace not found")
        if not with_paths:
            return [{"name": n} for n in sorted(workspace.repositories)]
        return [{"name": n, "path": p} for n, p in sorted(workspace.repositories.items())]

