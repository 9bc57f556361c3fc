"""The CreationPlan: the validated request, as stored durably in Claimed. A
recovering Runtime acts from this manifest alone. A value object: building it,
hashing it and its manifest need no I/O."""

from __future__ import annotations

import hashlib
import json
import operator
import uuid
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any


@dataclass(frozen=True)
class CreationPlan:
    workspace_id: uuid.UUID
    external_id: str | None
    identifier: str
    title: str
    description: str
    workflow: str
    workflow_step: str
    repositories: list[str] = field(default_factory=list)
    attachments: list[str] = field(default_factory=list)
    start_agent: bool = False
    agent_profile: str | None = None
    parent_id: uuid.UUID | None = None
    # Resolved at validation, so the Runtime needs nothing but this manifest.
    repository_paths: dict[str, str] = field(default_factory=dict)
    wip_limit: int | None = None
    # Names of the effect steps the creation must prove before Completing.
    steps: list[str] = field(default_factory=list)
    # The run whose credential asked for this task (an agent creating tasks);
    # its agent counts against that run's and the workspace's agent limits.
    # Left out of the manifest when None, so other plans keep their manifest.
    started_by_run: str | None = None

    def to_manifest(self) -> dict[str, Any]:
        """The manifest, built once per plan (a create needs it several times);
        treat it as read-only."""
        made: dict[str, Any] | None = self.__dict__.get("_manifest")
        if made is None:
            made = self.__dict__["_manifest"] = self._made_manifest()
        return made

    def _made_manifest(self) -> dict[str, Any]:
        # Every field is a str, bool, int, UUID or a flat list/dict of str, so a
        # shallow copy of each container is a full copy. The names are listed
        # once (_FIELD_NAMES) and read by one getter: ``dataclasses.fields``
        # and a type test per field were a quarter of a create's plan work.
        manifest: dict[str, Any] = dict(zip(_FIELD_NAMES, _READ_FIELDS(self.__dict__), strict=True))
        for name in _CONTAINERS:
            manifest[name] = manifest[name].copy()
        manifest["workspace_id"] = str(self.workspace_id)
        manifest["parent_id"] = str(self.parent_id) if self.parent_id else None
        if self.started_by_run is None:
            del manifest["started_by_run"]
        return manifest

    @cached_property
    def plan_hash(self) -> str:
        canonical = _CANONICAL.encode(self.to_manifest())
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


_FIELD_NAMES = tuple(item.name for item in fields(CreationPlan))
_READ_FIELDS = operator.itemgetter(*_FIELD_NAMES)
_CONTAINERS = tuple(
    item.name for item in fields(CreationPlan) if item.name in ("repositories", "attachments",
                                                                 "repository_paths", "steps")
)
# What json.dumps(manifest, sort_keys=True, separators=(",", ":")) builds per
# call; the one encoder is stateless between calls.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
