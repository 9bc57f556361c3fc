"""What a projection is: a name, and a function applying one event inside the
runner's transaction. Projections may also declare

- ``topics``: the only event topics they read (the runner filters in SQL, so a
  projection never decodes events it ignores — this is what makes rebuilds fast);
- ``apply_batch``: apply many events at once (bulk reads and writes);
- ``tables`` and a ``suffix`` (see ``kandev_es.storage.tables.TableSet``): what a blue/green rebuild
  recreates as ``<table>_next`` before swapping it in.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from eventsourcing.domain import Aggregate
from eventsourcing.utils import get_topic, resolve_topic

from kandev_es.storage.database import Transaction


class Projection(Protocol):
    name: str

    def apply(self, tx: Transaction, event: Any, position: int, backend: str) -> None: ...


@runtime_checkable
class BatchProjection(Protocol):
    def apply_batch(
        self, tx: Transaction, items: Sequence[tuple[Any, int]], backend: str
    ) -> None: ...


@runtime_checkable
class Rebuildable(Protocol):
    name: str
    tables: tuple[str, ...]

    def with_suffix(self, suffix: str) -> Any: ...


def event_topics(*aggregates: type[Aggregate]) -> tuple[str, ...]:
    """Every event class nested in the given aggregates, as stored topics."""
    topics: list[str] = []
    for aggregate in aggregates:
        for value in vars(aggregate).values():
            is_event = isinstance(value, type) and issubclass(value, Aggregate.Event)
            if is_event and value is not getattr(aggregate, "Event", None):
                topics.append(get_topic(value))
    return tuple(topics)


def known_topics() -> set[str]:
    """Every event topic this version can read: the events nested in every
    aggregate class loaded (bootstrap has imported the domain by then)."""
    found: set[str] = set()
    classes = list(Aggregate.__subclasses__())
    while classes:
        aggregate = classes.pop()
        classes.extend(aggregate.__subclasses__())
        found.update(event_topics(aggregate))
    return found


def resolvable(topic: str) -> bool:
    """Whether this version can decode events of ``topic`` (an old name
    registered for a renamed class counts)."""
    try:
        resolve_topic(topic)
    except Exception:  # TopicError, or the module or class is gone
        return False
    return True


def db_id(value: Any, backend: str) -> Any:
    """UUID columns are native on PostgreSQL and text on SQLite."""
    if value is None:
        return None
    return value if backend == "postgres" else str(value)


DTO_CHUNK = 500


def load_dtos(
    tx: Transaction, table: str, task_ids: Iterable[Any], backend: str
) -> dict[uuid.UUID, dict[str, Any]]:
    """The stored DTO of each given task in ``table`` (a fixed, owned table
    name), read in chunks so a large batch stays one statement per chunk."""
    ids = list(task_ids)
    found: dict[uuid.UUID, dict[str, Any]] = {}
    for start in range(0, len(ids), DTO_CHUNK):
        chunk = ids[start : start + DTO_CHUNK]
        marks = ", ".join("?" for _ in chunk)
        for task_id, dto in tx.execute(
            f"SELECT task_id, dto FROM {table} WHERE task_id IN ({marks})",
            [db_id(i, backend) for i in chunk],
        ):
            found[uuid.UUID(str(task_id))] = json.loads(dto)
    return found
