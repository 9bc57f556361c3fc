"""The event-sourced application: load and save aggregates, atomically."""

from __future__ import annotations

import uuid
from typing import TypeVar

from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.domain import Aggregate
from eventsourcing.persistence import IntegrityError, OperationalError

from kandev_es.config import Settings
from kandev_es.errors import StoreUnavailable
from kandev_es.storage.database import parse_postgres_url

A = TypeVar("A", bound=Aggregate)


class VersionConflict(Exception):
    """Another writer appended to one of the saved streams first."""


# Recently used aggregates stay in memory and are fast-forwarded with the events
# recorded since (one cheap query, nothing to decode when nothing changed), and
# handed out as deep copies, so a failed save never pollutes the cache.
AGGREGATE_CACHE = {
    "AGGREGATE_CACHE_MAXSIZE": "20000",
    "AGGREGATE_CACHE_FASTFORWARD": "y",
    "DEEPCOPY_FROM_AGGREGATE_CACHE": "y",
}


def event_store_env(settings: Settings) -> dict[str, str]:
    create = "y" if settings.create_tables else "n"
    if settings.database_url:
        env = parse_postgres_url(settings.database_url)
        env.update(
            PERSISTENCE_MODULE="eventsourcing.postgres",
            POSTGRES_POOL_SIZE=str(settings.pool_size),
            POSTGRES_MAX_OVERFLOW=str(settings.pool_size),
            POSTGRES_CONNECT_TIMEOUT="5",
            POSTGRES_PRE_PING=settings.pg_pre_ping,
            POSTGRES_ENABLE_DB_FUNCTIONS="n",
            CREATE_TABLE=create,
        )
        env.setdefault("POSTGRES_SCHEMA", "")
        env.update(AGGREGATE_CACHE)
        return env
    return {
        **AGGREGATE_CACHE,
        "PERSISTENCE_MODULE": "eventsourcing.sqlite",
        "SQLITE_DBNAME": str(settings.sqlite_path),
        "SQLITE_LOCK_TIMEOUT": "10",
        "CREATE_TABLE": create,
    }


class Tasks(Application):  # type: ignore[type-arg]
    """Identities, tasks, workspaces and tokens share one store, so a creation
    can save its Identity and Task events in one atomic ``save``."""

    name = "kandev"

    def __init__(self, settings: Settings) -> None:
        super().__init__(env=event_store_env(settings))

    def load(self, aggregate_id: uuid.UUID, kind: type[A]) -> A | None:
        try:
            aggregate: Aggregate = self.repository.get(aggregate_id)
        except AggregateNotFoundError:
            return None
        except OperationalError as error:
            raise StoreUnavailable(f"event store unavailable: {error}") from None
        if not isinstance(aggregate, kind):
            return None
        return aggregate

    def read(self, aggregate_id: uuid.UUID, kind: type[A]) -> A | None:
        """Like ``load`` but shares the cached aggregate instead of copying it:
        for reads only — never call a command on what this returns."""
        try:
            aggregate: Aggregate = self.repository.get(aggregate_id, deepcopy_from_cache=False)
        except AggregateNotFoundError:
            return None
        except OperationalError as error:
            raise StoreUnavailable(f"event store unavailable: {error}") from None
        return aggregate if isinstance(aggregate, kind) else None

    def save_atomically(self, *aggregates: Aggregate) -> int:
        """Save all pending events in one transaction; return the last
        notification id. A version clash becomes ``VersionConflict``."""
        try:
            recordings = self.save(*aggregates)
        except IntegrityError:
            raise VersionConflict from None
        except OperationalError as error:
            raise StoreUnavailable(f"event store unavailable: {error}") from None
        return max((r.notification.id for r in recordings), default=0)

    def max_notification_id(self) -> int:
        return int(self.recorder.max_notification_id() or 0)
