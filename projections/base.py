"""What a projection is: a name, and a function applying one event inside the
runner's transaction."""

from __future__ import annotations

from typing import Any, Protocol

from kandev_es.storage.database import Transaction


class Projection(Protocol):
    name: str

    def apply(self, tx: Transaction, event: Any, position: int, backend: str) -> None: ...


def db_id(value: Any, backend: str) -> Any:
    """UUID columns are native on PostgreSQL and text on SQLite."""
    if value is None:
        return None
    return value if backend == "postgres" else str(value)
