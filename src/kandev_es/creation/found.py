"""Found: what holds an identity right now, answered from reads and never
changing anything. The create protocol's step 3, its re-read at admission and
the lookup route all answer from here."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from kandev_es.application import Tasks
from kandev_es.creation.outcomes import CreateResult, Outcome
from kandev_es.domain.external_id import identity_id
from kandev_es.domain.identity import Identity
from kandev_es.domain.task import Task
from kandev_es.errors import Unavailable
from kandev_es.views import task_dto

DTO_CACHE_SIZE = 4096
T = TypeVar("T")


class Holders:
    def __init__(self, app: Tasks) -> None:
        self._app = app
        # The DTO of each recently answered task, by version: a version of a
        # stream is one state (events only), so every thread's copy of it has
        # the same DTO, and a retry storm does not rebuild it for every answer.
        self._dtos: dict[uuid.UUID, tuple[int, Mapping[str, Any]]] = {}

    def read_ids(self, workspace_id: uuid.UUID, key: uuid.UUID | None) -> list[uuid.UUID]:
        """What to read for a lookup: the workspace, the identity and (a guess
        from the last read) its holder's task, so a Found is one query."""
        ids = [workspace_id]
        if key is not None:
            ids.append(key)
            seen = self._app.snapshot(key, Identity)
            holder = seen.holder if seen is not None else None
            if holder is not None:
                ids.append(holder.task_id)
        return ids

    def lookup(self, workspace_id: uuid.UUID, external_id: str) -> CreateResult | None:
        key = identity_id(workspace_id, external_id)
        reads = self._app.read_many(self.read_ids(workspace_id, key)[1:])
        return self.found(as_kind(reads[key], Identity), reads)

    def found(
        self, identity: Identity | None, reads: Mapping[uuid.UUID, object] | None = None
    ) -> CreateResult | None:
        """Found (settled or not) if the identity has a holder, else None."""
        holder = identity.holder if identity is not None else None
        if holder is None:
            return None
        task = as_kind((reads or {}).get(holder.task_id), Task)
        if task is None:  # the guess missed: the identity has a new holder
            task = as_kind(self._app.read_many([holder.task_id])[holder.task_id], Task)
        if task is None:  # pragma: no cover - Claimed and Task.Created share one save
            raise Unavailable("identity holder has no task stream")
        outcome = Outcome.FOUND_SETTLED if holder.settled else Outcome.FOUND_UNSETTLED
        return CreateResult(outcome, self._dto(task))

    def _dto(self, task: Task) -> Mapping[str, Any]:
        cached = self._dtos.get(task.id)
        if cached is not None and cached[0] == task.version:
            return cached[1]
        dto = MappingProxyType(task_dto(task))  # shared between answers: read-only
        if len(self._dtos) >= DTO_CACHE_SIZE:
            self._dtos.clear()
        self._dtos[task.id] = (task.version, dto)
        return dto


def as_kind(aggregate: object, kind: type[T]) -> T | None:
    """The aggregate if it is a ``kind`` (a read of a missing or other stream is not)."""
    return aggregate if isinstance(aggregate, kind) else None
