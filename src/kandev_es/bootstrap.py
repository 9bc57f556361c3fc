"""Composition root: wire storage, services and projections once. Tests wire
the same code with other settings, never with a forked path."""

from __future__ import annotations

import logging
import sqlite3
from contextlib import AbstractContextManager
from dataclasses import dataclass

from eventsourcing.persistence import PersistenceError

from kandev_es.application import Tasks
from kandev_es.bulk.service import BatchService
from kandev_es.config import Settings, data_path
from kandev_es.creation.driver import CreationDriver
from kandev_es.creation.service import CreationService
from kandev_es.erasure.service import ForgetService
from kandev_es.errors import InvalidSetting, KandevError, SchemaSetupFailed, StoreUnavailable
from kandev_es.projections.base import Projection
from kandev_es.projections.creations import CreationsProjection
from kandev_es.projections.feeds import FeedsProjection
from kandev_es.projections.handover import hand_over
from kandev_es.projections.identities import IdentitiesProjection
from kandev_es.projections.inline import InlineViews
from kandev_es.projections.runner import ProjectionRunner
from kandev_es.projections.tasks import TasksProjection
from kandev_es.runtime.agents import ExitedAgents
from kandev_es.runtime.recovery import Runtime
from kandev_es.runtime.settle import ParkedCreations
from kandev_es.services.attachments import AttachmentService
from kandev_es.services.audit_links import AuditLinkService
from kandev_es.services.auth import TokenService
from kandev_es.services.creations import CreationStatusService
from kandev_es.services.fanout import FeedFanout, FeedSource, StreamAccess
from kandev_es.services.ledger import Sequencer
from kandev_es.services.ledger_keys import adopt_anchor, ensure_key
from kandev_es.services.release import ReleaseService
from kandev_es.services.repositories import RepositoryService
from kandev_es.services.tasks import TaskService
from kandev_es.services.workspace_deletion import WorkspaceDeletionService
from kandev_es.services.workspaces import WorkspaceService
from kandev_es.storage import ledger as ledger_store
from kandev_es.storage.attestation import AttestationGuard
from kandev_es.storage.breaker import StoreBreaker
from kandev_es.storage.database import Database, PostgresDatabase, SQLiteDatabase
from kandev_es.storage.durability import Durability, durability
from kandev_es.storage.schema import create_tables
from kandev_es.storage.setup_lock import postgres_setup_lock, sqlite_setup_lock
from kandev_es.webhooks import Webhooks
from kandev_es.webhooks import set_up as set_up_webhooks

log = logging.getLogger("kandev_es")


@dataclass
class Services:
    settings: Settings
    app: Tasks
    database: Database
    attestation: AttestationGuard
    driver: CreationDriver
    creation: CreationService
    batch: BatchService
    tasks: TaskService
    workspaces: WorkspaceService
    tokens: TokenService
    projections: ProjectionRunner
    repositories: RepositoryService
    attachments: AttachmentService
    creation_status: CreationStatusService
    release: ReleaseService
    workspace_deletion: WorkspaceDeletionService
    audit_links: AuditLinkService
    # The tamper-evident history's sequencer (services/ledger.py; docs/auditing.md).
    ledger: Sequencer
    # Subscriptions and their deliverer (webhooks/; docs/webhooks.md).
    webhooks: Webhooks
    # The process's one feed reader, fanned out to every SSE stream (services/fanout.py).
    feeds: FeedFanout

    def parked(self) -> ParkedCreations:
        """Operators' view and settling of the creations the Runtime parked."""
        return ParkedCreations(
            self.app, self.database, self.projections, self.driver, self.settings.recovery_attempts
        )

    def forgetting(self) -> ForgetService:
        """Forgetting tasks (erasure/; docs/auditing.md: Erasure)."""
        return ForgetService(self.app, self.database, lambda: self.ledger.signer)

    def runtime(self, owner_id: str | None = None) -> Runtime:
        """A recovery Runtime over these parts (``kandev-es runtime``, the app's thread)."""
        return Runtime(
            self.app,
            self.database,
            self.projections,
            self.driver,
            self.settings.lease_seconds,
            ExitedAgents(data_path(self.settings, "agents"), self.tokens, self.app),
            owner_id,
            attempts=self.settings.recovery_attempts,
            backoff_base_seconds=self.settings.recovery_backoff_seconds,
        )

    def close(self) -> None:
        self.webhooks.stop()
        self.feeds.stop()
        self.ledger.stop()
        self.projections.stop()
        self.database.close()
        self.app.close()


def open_database(settings: Settings, breaker: StoreBreaker | None = None) -> Database:
    if settings.postgres is not None:
        return PostgresDatabase(
            settings.postgres,
            pool_size=settings.pool_size,
            breaker=breaker,
            timeout=settings.pg_connect_timeout,
        )
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    return SQLiteDatabase(settings.sqlite_path)


def store_exists(settings: Settings) -> bool:
    """Whether ``settings`` point at a store `db init` (or `serve`) made: its
    tables are there. Creates nothing, not even the data dir; an unreachable
    PostgreSQL raises StoreUnavailable."""
    if not settings.database_url:
        path = settings.sqlite_path.resolve()
        if not path.is_file():
            return False
        connection = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
        try:
            rows = connection.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'tasks_view'"
            ).fetchall()
        except sqlite3.DatabaseError:  # not an SQLite file at all
            return False
        finally:
            connection.close()
        return bool(rows)
    try:
        import psycopg
    except ImportError:
        raise InvalidSetting(
            "a postgresql:// store needs the postgres extra: pip install 'kandev-es[postgres]'"
        ) from None

    target = settings.postgres
    assert target is not None
    schema = target.schema
    try:
        # One plain connection, not a pool: its error says why (refused, auth, ...).
        postgres = psycopg.connect(target.conninfo)
    except psycopg.OperationalError as error:
        reason = " ".join(str(error).split())
        raise StoreUnavailable(f"database unavailable at {settings.location}: {reason}") from None
    try:
        found = postgres.execute(
            "SELECT to_regclass(%s) IS NOT NULL",
            (f'"{schema}".tasks_view' if schema else "tasks_view",),
        ).fetchall()
    finally:
        postgres.close()
    return bool(found[0][0])


def init_storage(settings: Settings) -> Durability | None:
    """Create every table once (``kandev-es db init``, and ``serve`` before
    workers); on PostgreSQL, say whether a commit waits for a synchronous standby.
    Any number of processes may run it at once: one sets up at a time
    (storage/setup_lock.py), the others then find everything there. What it
    cannot do (no right to create, a data dir it cannot write) is one
    SchemaSetupFailed naming the store and the reason."""
    try:
        with _setup_lock(settings):
            return _set_up(settings)
    except KandevError:
        raise
    except Exception as error:  # psycopg's or the OS's: the reason, on one line
        if not _is_setup_error(error):
            raise
        reason = " ".join(str(error).split())
        where = settings.location
        raise SchemaSetupFailed(f"cannot set up the store at {where}: {reason}") from None


def _setup_lock(settings: Settings) -> AbstractContextManager[None]:
    if settings.postgres is not None:
        return postgres_setup_lock(settings.postgres)
    return sqlite_setup_lock(settings.sqlite_path)


def _set_up(settings: Settings) -> Durability | None:
    database = open_database(settings)
    try:
        if isinstance(database, PostgresDatabase):
            database.create_schema()
        create_tables(database)
        set_up_webhooks(settings, database)  # their tables and the v1a key
        found = durability(database)
        with database.transaction() as tx:
            latest = ledger_store.latest_checkpoint(tx)
        app = Tasks(settings.with_overrides(create_tables=True))
        try:
            with database.transaction() as tx:  # SQLite: only canonical stream ids
                for statement in ledger_store.stream_id_guard_ddl(
                    database.backend, app.recorder.events_table_name  # type: ignore[attr-defined]
                ):
                    tx.execute(statement)
            # Read models a version before inline projections left behind the
            # head are brought up to it, once, before any save writes inline.
            hand_over(ProjectionRunner(app, database, read_models()))
        finally:
            app.close()
    finally:
        database.close()
    # The checkpoint key: checked (mode 0600), made at a deployment's first
    # start, never silently replaced once checkpoints were signed.
    ensure_key(settings, signed_before=latest is not None)
    adopt_anchor(settings, None if latest is None else latest[1])
    return found


def read_models() -> list[Projection]:
    """Every read model; each written inline by the saves and replayed by rebuilds."""
    return [TasksProjection(), IdentitiesProjection(), CreationsProjection(), FeedsProjection()]


def _is_setup_error(error: Exception) -> bool:
    # The library wraps the driver's errors in its own (PersistenceError).
    if isinstance(error, (OSError, sqlite3.Error, PersistenceError)):
        return True
    try:
        import psycopg
    except ImportError:
        return False
    return isinstance(error, psycopg.Error)


def bootstrap(settings: Settings) -> Services:
    if settings.create_tables:
        init_storage(settings)
    app = Tasks(settings.with_overrides(create_tables=False))
    # One breaker for both pools: they talk to the same database.
    database = open_database(settings, app.breaker)
    attestation = AttestationGuard(database)
    if attestation.current.ok:
        log.info("schema attested backend=%s", database.backend)
    else:
        log.error(
            "schema attestation FAILED backend=%s problems=%s; external-ID traffic refused",
            database.backend,
            attestation.current.problems,
        )
    app.inline = InlineViews()  # the read models, written in each save's transaction
    projections = ProjectionRunner(app, database, read_models())
    notifier = getattr(app.recorder, "notifier", None)
    if notifier is not None and not projections.asynchronous():
        notifier.enabled = False  # nothing the loop does needs waking at each save
    tokens = TokenService(app, settings.run_token_ttl)
    # One driver for the creating request, workspace deletion and the Runtime;
    # agent launch gets its run credentials from the token service through it.
    driver = CreationDriver(app, settings, tokens)
    creation = CreationService(app, attestation, settings, driver)
    return Services(
        settings=settings,
        app=app,
        database=database,
        attestation=attestation,
        driver=driver,
        creation=creation,
        batch=BatchService(app, creation, settings.batch_max_items, settings.lease_seconds),
        tasks=TaskService(app, database),
        workspaces=WorkspaceService(app, database),
        tokens=tokens,
        projections=projections,
        repositories=RepositoryService(app, settings.allowed_repository_roots),
        attachments=AttachmentService(app, settings),
        creation_status=CreationStatusService(app),
        release=ReleaseService(app, attestation),
        workspace_deletion=WorkspaceDeletionService(
            app, database, projections, settings, driver
        ),
        audit_links=AuditLinkService(app, settings.audit_link_seconds),
        ledger=Sequencer(app, database, settings),
        webhooks=Webhooks.build(settings, app, database),
        feeds=FeedFanout(FeedSource(app, database), StreamAccess(app)),
    )
