"""Our own tables beside the event store: read models, projection tracking and
the office identifier counters. Created once by ``kandev-es db init``."""

from __future__ import annotations

from kandev_es.storage.database import Database
from kandev_es.storage.ledger import ledger_ddl

# Each read model written inline (in the saves' transactions) and the position
# from which it was: the events at or below it were applied by the projection
# loop before (projections/handover.py). A row is never changed.
INLINE_DDL = (
    "CREATE TABLE IF NOT EXISTS inline_projections ("
    " name TEXT PRIMARY KEY, since BIGINT NOT NULL)"
)

SQLITE_DDL = (
    "CREATE TABLE IF NOT EXISTS projection_tracking ("
    " name TEXT PRIMARY KEY, position INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS tasks_view ("
    " task_id TEXT PRIMARY KEY, workspace_id TEXT NOT NULL, identifier TEXT NOT NULL,"
    " external_id TEXT COLLATE BINARY, phase TEXT NOT NULL, archived INTEGER NOT NULL,"
    " revision INTEGER NOT NULL, position INTEGER NOT NULL, dto TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS tasks_view_workspace ON tasks_view (workspace_id, position)",
    "CREATE TABLE IF NOT EXISTS identities_view ("
    " identity_id TEXT PRIMARY KEY, workspace_id TEXT NOT NULL,"
    " external_id TEXT COLLATE BINARY NOT NULL, task_id TEXT, tenure INTEGER NOT NULL,"
    " phase TEXT NOT NULL, held INTEGER NOT NULL)",
    "CREATE UNIQUE INDEX IF NOT EXISTS identities_view_external_id"
    " ON identities_view (workspace_id, external_id COLLATE BINARY)",
    "CREATE TABLE IF NOT EXISTS creations_view ("
    " identity_id TEXT NOT NULL, tenure INTEGER NOT NULL, workspace_id TEXT NOT NULL,"
    " task_id TEXT NOT NULL, phase TEXT NOT NULL, epoch INTEGER NOT NULL,"
    " lease_expires_at REAL NOT NULL, PRIMARY KEY (identity_id, tenure))",
    "CREATE TABLE IF NOT EXISTS office_counters ("
    " workspace_id TEXT PRIMARY KEY, last_value INTEGER NOT NULL)",
    # Feeds (projections/feeds.py): position is the originating notification id.
    "CREATE TABLE IF NOT EXISTS feed_events ("
    " position INTEGER PRIMARY KEY, workspace_id TEXT NOT NULL, event_id TEXT NOT NULL,"
    " type TEXT NOT NULL, subject TEXT NOT NULL, timestamp TEXT NOT NULL, data TEXT NOT NULL)",
    "CREATE UNIQUE INDEX IF NOT EXISTS feed_events_event_id ON feed_events (event_id)",
    "CREATE INDEX IF NOT EXISTS feed_events_workspace ON feed_events (workspace_id, position)",
    "CREATE TABLE IF NOT EXISTS feed_tasks (task_id TEXT PRIMARY KEY, dto TEXT NOT NULL)",
    # Each task's data key (storage/sealing.py), deleted when the task is forgotten.
    "CREATE TABLE IF NOT EXISTS task_keys (task_id TEXT PRIMARY KEY, data_key TEXT NOT NULL)",
    INLINE_DDL,
)

POSTGRES_DDL = (
    "CREATE TABLE IF NOT EXISTS projection_tracking ("
    " name TEXT PRIMARY KEY, position BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS tasks_view ("
    " task_id UUID PRIMARY KEY, workspace_id UUID NOT NULL, identifier TEXT NOT NULL,"
    ' external_id TEXT COLLATE "C", phase TEXT NOT NULL, archived BOOLEAN NOT NULL,'
    " revision INTEGER NOT NULL, position BIGINT NOT NULL, dto TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS tasks_view_workspace ON tasks_view (workspace_id, position)",
    "CREATE TABLE IF NOT EXISTS identities_view ("
    " identity_id UUID PRIMARY KEY, workspace_id UUID NOT NULL,"
    ' external_id TEXT COLLATE "C" NOT NULL, task_id UUID, tenure INTEGER NOT NULL,'
    " phase TEXT NOT NULL, held BOOLEAN NOT NULL)",
    "CREATE UNIQUE INDEX IF NOT EXISTS identities_view_external_id"
    ' ON identities_view (workspace_id, external_id COLLATE "C")',
    "CREATE TABLE IF NOT EXISTS creations_view ("
    " identity_id UUID NOT NULL, tenure INTEGER NOT NULL, workspace_id UUID NOT NULL,"
    " task_id UUID NOT NULL, phase TEXT NOT NULL, epoch INTEGER NOT NULL,"
    " lease_expires_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (identity_id, tenure))",
    "CREATE TABLE IF NOT EXISTS feed_events ("
    " position BIGINT PRIMARY KEY, workspace_id UUID NOT NULL, event_id UUID NOT NULL,"
    " type TEXT NOT NULL, subject UUID NOT NULL, timestamp TEXT NOT NULL, data TEXT NOT NULL)",
    "CREATE UNIQUE INDEX IF NOT EXISTS feed_events_event_id ON feed_events (event_id)",
    "CREATE INDEX IF NOT EXISTS feed_events_workspace ON feed_events (workspace_id, position)",
    "CREATE TABLE IF NOT EXISTS feed_tasks (task_id UUID PRIMARY KEY, dto TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS task_keys (task_id UUID PRIMARY KEY, data_key TEXT NOT NULL)",
    INLINE_DDL,
)

IDENTITY_INDEX = "identities_view_external_id"
EXTERNAL_ID_TABLES = ("identities_view", "tasks_view")


def create_tables(database: Database) -> None:
    ddl: tuple[str, ...] = POSTGRES_DDL if database.backend == "postgres" else SQLITE_DDL
    ddl += ledger_ddl(database.backend)  # the tamper-evident history's tables
    with database.transaction() as tx:
        for statement in ddl:
            tx.execute(statement)
