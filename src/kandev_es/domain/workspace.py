"""The Workspace aggregate: task prefix, workflows and policy of one tenant."""

from __future__ import annotations

import re
import uuid

from eventsourcing.domain import Aggregate

from kandev_es.domain.errors import DomainRuleBroken

WORKSPACE_NAMESPACE = uuid.UUID("0d4f3b7e-8a51-4b61-9a0e-5c1f7d2e9b33")
DEFAULT_WORKFLOWS: dict[str, list[str]] = {
    "default": ["backlog", "in_progress", "review", "done"],
}
# Both are matched in full (fullmatch), never with "$" (it matches before a trailing newline).
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
PREFIX_PATTERN = re.compile(r"[A-Z][A-Z0-9]{0,9}")
REPOSITORY_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def workspace_id_for(name: str, incarnation: int = 0) -> uuid.UUID:
    """Names are unique among live workspaces: the id derives from the name and
    its incarnation, so the event store's version check rejects a second
    workspace of one incarnation. A deleted name is used again by the next
    incarnation, whose id (and so every task and identity id under it) never
    meets the old history. Incarnation 0 keeps the original id; ``#`` cannot
    occur in a name, so no name's id equals another's incarnation."""
    if incarnation == 0:
        return uuid.uuid5(WORKSPACE_NAMESPACE, name)
    return uuid.uuid5(WORKSPACE_NAMESPACE, f"{name}#{incarnation}")


class Workspace(Aggregate):
    class Opened(Aggregate.Created):
        name: str
        task_prefix: str
        workflows: dict[str, list[str]]

    def __init__(self, name: str, task_prefix: str, workflows: dict[str, list[str]]) -> None:
        self.name = name
        self.task_prefix = task_prefix
        self.workflows = {k: list(v) for k, v in workflows.items()}
        self.repositories: dict[str, str] = {}
        self.agent_profiles = ["default"]
        self.wip_limit: int | None = None
        self.deletion_generation = 0
        self.deleted = False

    @classmethod
    def open(cls, name: str, task_prefix: str = "KAN", incarnation: int = 0) -> Workspace:
        if not NAME_PATTERN.fullmatch(name):
            raise DomainRuleBroken(
                "workspace name must be 1-64 characters of letters, digits, '_', '.', '-'"
            )
        if not PREFIX_PATTERN.fullmatch(task_prefix):
            raise DomainRuleBroken("task prefix must be 1-10 upper-case letters or digits")
        return cls._create(
            cls.Opened,
            id=workspace_id_for(name, incarnation),
            name=name,
            task_prefix=task_prefix,
            workflows=DEFAULT_WORKFLOWS,
        )

    def register_repository(self, name: str, path: str) -> None:
        if not REPOSITORY_NAME_PATTERN.fullmatch(name):
            # Names become step names, branch config keys and worktree paths.
            raise DomainRuleBroken("repository name must be letters, digits, '_', '.', '-'")
        if name in self.repositories:
            raise DomainRuleBroken(f"repository {name!r} is already registered")
        self.trigger_event(self.RepositoryRegistered, name=name, path=path)

    class RepositoryRegistered(Aggregate.Event):
        name: str
        path: str

        def apply(self, aggregate: Workspace) -> None:
            aggregate.repositories[self.name] = self.path

    def set_wip_limit(self, limit: int | None) -> None:
        if limit is not None and limit < 1:
            raise DomainRuleBroken("wip_limit must be a positive integer or null")
        if limit != self.wip_limit:
            self.trigger_event(self.PolicyChanged, wip_limit=limit)

    class PolicyChanged(Aggregate.Event):
        wip_limit: int | None

        def apply(self, aggregate: Workspace) -> None:
            aggregate.wip_limit = self.wip_limit

    def delete(self) -> int:
        """Mark deleted; the new deletion generation fences every creation in it."""
        if self.deleted:
            raise DomainRuleBroken("workspace is already deleted")
        generation = self.deletion_generation + 1
        self.trigger_event(self.Deleted, generation=generation)
        return generation

    class Deleted(Aggregate.Event):
        generation: int

        def apply(self, aggregate: Workspace) -> None:
            aggregate.deleted = True
            aggregate.deletion_generation = self.generation
