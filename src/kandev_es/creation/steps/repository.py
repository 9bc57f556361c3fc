"""Repository attachment: a fresh branch ``kandev/<identifier>`` and a git
worktree for it under the data dir. The branch is marked with the task id
(``branch.<name>.kandevtask``) before it exists, so a rerun after a crash can
tell its own half-made branch from someone else's.

The worktree's path depends on the node (``<data dir>/worktrees/<task id>/
<repository>``), so the step finds it by its branch, which git records with
each worktree: an owner on another node (a Runtime's takeover) recognises,
uses and removes the worktree the first owner made under its own data dir."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any

from kandev_es.config import data_path
from kandev_es.creation import failpoints
from kandev_es.creation.steps.base import StepContext, StepFailed
from kandev_es.creation.steps.git import (
    GitError,
    branch_exists,
    branch_marker,
    git,
    is_work_tree_top,
    worktree_paths,
    worktrees_on_branch,
)
from kandev_es.errors import BranchTaken, RepositoryEffectFailed, RepositoryNotTopLevel


class RepositoryStep:
    def __init__(self, repository: str, path: str) -> None:
        self.repository = repository
        self.path = path
        self.name = f"repository:{repository}"

    def branch(self, ctx: StepContext) -> str:
        return f"kandev/{ctx.manifest['identifier']}"

    def worktree(self, ctx: StepContext) -> Path:
        return data_path(ctx.settings, "worktrees", str(ctx.task_id), self.repository)

    def _made(self, ctx: StepContext) -> Path | None:
        """The task's worktree, wherever an owner made it: this node's path if
        git lists it, else any existing worktree with the task's branch checked
        out (another node's data dir). Call only with the branch ours."""
        worktree = self.worktree(ctx)
        if str(worktree.resolve()) in worktree_paths(self.path) and worktree.exists():
            return worktree
        for other in worktrees_on_branch(self.path, self.branch(ctx)):
            if Path(other).is_dir():
                return Path(other)
        return None

    def _evidence(self, ctx: StepContext, worktree: Path) -> dict[str, Any]:
        head = git(worktree, "rev-parse", "HEAD").stdout.strip()
        return {
            "repository": self.repository,
            "branch": self.branch(ctx),
            "worktree": str(worktree),
            "head": head,
        }

    def run(self, ctx: StepContext) -> dict[str, Any]:
        branch, worktree, task = self.branch(ctx), self.worktree(ctx), str(ctx.task_id)
        if not is_work_tree_top(self.path):
            # Checked again here, before any git command: a folder inside an
            # enclosing work tree (registered by an older version, or replaced
            # since) would put our branch, worktree and config in that repository.
            raise StepFailed(
                RepositoryNotTopLevel(
                    f"repository {self.repository!r} is not the top of its own git work tree",
                    field="repositories",
                )
            )
        try:
            marker = branch_marker(self.path, branch)
            if branch_exists(self.path, branch) and marker != task:
                raise StepFailed(BranchTaken(f"branch {branch} already exists", branch=branch))
            failpoints.hit(ctx.settings, "repository:effect")  # tests: just before the effect
            ctx.fence()  # held still? an owner that lost its lease makes nothing
            failpoints.hit(ctx.settings, "repository:fenced")  # tests: a pause after the check
            if marker is None:
                git(self.path, "config", f"branch.{branch}.kandevtask", task)
            if not branch_exists(self.path, branch):
                git(self.path, "branch", branch, "HEAD")
            made = self._made(ctx)
            if made is not None:  # this node's, or another owner's on its node
                return self._evidence(ctx, made)
            if worktree.exists():
                shutil.rmtree(worktree)  # a half-made checkout from a crash
            git(self.path, "worktree", "prune")
            worktree.parent.mkdir(parents=True, exist_ok=True)
            # Hooks (post-checkout) may take long: the command stops once the lease is lost.
            git(self.path, "worktree", "add", str(worktree), branch, stop=ctx.stop)
            return self._evidence(ctx, worktree)
        except GitError as error:
            failed = RepositoryEffectFailed(f"the {self.repository} repository step failed")
            raise StepFailed(failed, detail=str(error)) from None

    def _repository_gone(self) -> bool:
        """No repository of ours at the path: gone, or (never ours to touch) not
        the top of its own work tree."""
        return not is_work_tree_top(self.path)

    def reconcile(self, ctx: StepContext) -> dict[str, Any] | None:
        if self._repository_gone():
            return None
        branch = self.branch(ctx)
        if not branch_exists(self.path, branch):
            return None
        if branch_marker(self.path, branch) != str(ctx.task_id):
            return None
        made = self._made(ctx)
        return None if made is None else self._evidence(ctx, made)

    def compensate(self, ctx: StepContext) -> None:
        branch, worktree, task = self.branch(ctx), self.worktree(ctx), str(ctx.task_id)
        if self._repository_gone():
            # Nothing of ours can be left in a repository that no longer exists,
            # and an enclosing repository is never touched.
            shutil.rmtree(worktree, ignore_errors=True)
            _remove_task_folder(worktree, task)
            return
        # The marker is written before the branch is made, so a branch without
        # our marker was never ours: never touch another task's branch.
        ours = branch_marker(self.path, branch) == task
        if str(worktree.resolve()) in worktree_paths(self.path):
            git(self.path, "worktree", "remove", "--force", str(worktree))
        if worktree.exists():
            shutil.rmtree(worktree)
        git(self.path, "worktree", "prune")
        if ours and branch_exists(self.path, branch):
            # A worktree of another node (its own data dir) that made this
            # task's branch: the branch is ours, so is its checkout, and git
            # deletes no branch still checked out.
            for other in worktrees_on_branch(self.path, branch):
                git(self.path, "worktree", "remove", "--force", other)
                _remove_task_folder(Path(other), task)
            git(self.path, "branch", "-D", branch)
        if ours:
            git(self.path, "config", "--unset", f"branch.{branch}.kandevtask", check=False)
        _remove_task_folder(worktree, task)

    def remove_forcibly(self, ctx: StepContext) -> None:
        """An operator's abort, where ``compensate`` failed (git refuses a
        worktree it cannot read, say): the worktree folder is ours (under the
        data dir, named by the task), so it goes without asking git; git then
        forgets it, and our branch and marker go as in ``compensate``."""
        shutil.rmtree(self.worktree(ctx), ignore_errors=True)
        if not self._repository_gone():
            git(self.path, "worktree", "prune")
        self.compensate(ctx)

    def absent(self, ctx: StepContext) -> bool:
        branch, worktree = self.branch(ctx), self.worktree(ctx)
        if self._repository_gone():
            return not worktree.exists()
        mine = branch_marker(self.path, branch) == str(ctx.task_id)
        return (
            not (mine and branch_exists(self.path, branch))
            and str(worktree.resolve()) not in worktree_paths(self.path)
            and not worktree.exists()
        )


def _remove_task_folder(worktree: Path, task: str) -> None:
    """The per-task folder a worktree was made in (``worktrees/<task id>/``),
    once it holds nothing (another repository step of the same task may still
    have its worktree there). Only a folder named by this task is touched."""
    folder = worktree.parent
    if folder.name != task:
        return
    with contextlib.suppress(OSError):  # not empty (another step's worktree), or gone
        folder.rmdir()
