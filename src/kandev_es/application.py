"""The event-sourced application: load and save aggregates, atomically."""

from __future__ import annotations

import copy
import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.domain import Aggregate
from eventsourcing.persistence import (
    IntegrityError,
    InterfaceError,
    JSONTranscoder,
    Notification,
    OperationalError,
    Recording,
    StoredEvent,
    Transcoder,
)
from eventsourcing.persistence import InternalError as StoreInternalError

from kandev_es import metrics
from kandev_es.config import Settings
from kandev_es.errors import Contended, InternalError, ProjectionFailed, StoreUnavailable
from kandev_es.observability import tracing
from kandev_es.storage.breaker import StoreBreaker, means_read_only, means_unreachable
from kandev_es.storage.sealing import SealingMapper
from kandev_es.storage.settled import Followed
from kandev_es.storage.sqlite_factory import SQLITE_FACTORY_TOPIC
from kandev_es.storage.sqlite_recorder import SQLITE_RECORDER_TOPIC
from kandev_es.storage.streams import StreamsAdvanced
from kandev_es.storage.transcoder import EventTranscoder
from kandev_es.storage.view_writes import ViewRows, ViewsFailed

# A task's DTO (views.task_dto) by task id, as its saver already made it.
TaskDtos = Mapping[uuid.UUID, dict[str, Any]]
# Makes a save's read-model rows from its events and aggregates (and the
# DTOs of its tasks after the save, where the saver has them).
InlineViews = Callable[[Sequence[Any], Sequence[Aggregate], TaskDtos | None], ViewRows]

A = TypeVar("A", bound=Aggregate)
L = TypeVar("L")
R = TypeVar("R")
log = logging.getLogger("kandev_es.store")


class VersionConflict(InternalError):
    """Another writer appended to one of the saved streams first (or, for a
    guarded save, to one of the streams it depended on)."""


THREAD_COPIES = 512
CONFLICT_ATTEMPTS = 8


class ReadCache:
    """Snapshots for ``Tasks.read_many``, shared by the process's threads but
    never handed out. A snapshot is never changed in place: catching up copies
    it, applies the new events and swaps the copy in. Each thread gets its own
    copy of a snapshot, made the first time it reads that version and reused
    while the version stays current — so two threads never hold one object
    (a command called on a read by mistake cannot tear another thread's read),
    and a retry storm still pays one copy per thread and version, not per read.
    Lookups take no lock (a dict read is atomic); the oldest entry goes first
    when full (a hot aggregate evicted is only read once more from its stream)."""

    def __init__(self, maxsize: int, per_thread: int = THREAD_COPIES) -> None:
        self._maxsize = maxsize
        self._per_thread = per_thread
        self._items: dict[uuid.UUID, Aggregate] = {}
        self._lock = threading.Lock()
        self._local = threading.local()

    def get(self, key: uuid.UUID) -> Aggregate | None:
        """The shared snapshot itself: for its version and catch-up copies only."""
        return self._items.get(key)

    def put(self, key: uuid.UUID, aggregate: Aggregate) -> bool:
        """Share ``aggregate`` (its caller lets go of it); False when a
        concurrent reader already stored a newer snapshot."""
        with self._lock:
            current = self._items.get(key)
            if current is not None and current.version > aggregate.version:
                return False
            self._items[key] = aggregate
            while len(self._items) > self._maxsize:
                del self._items[next(iter(self._items))]
            return True

    def handout(self, key: uuid.UUID, shared: Aggregate) -> Aggregate:
        """This thread's own copy of the shared snapshot ``shared``."""
        copies: dict[uuid.UUID, tuple[Aggregate, Aggregate]] | None = getattr(
            self._local, "copies", None
        )
        if copies is None:
            copies = self._local.copies = {}
        held = copies.get(key)
        # A command called on the copy moved its version on: copy afresh.
        if held is not None and held[0] is shared and held[1].version == shared.version:
            return held[1]
        own = copy.deepcopy(shared)
        copies.pop(key, None)
        copies[key] = (shared, own)
        while len(copies) > self._per_thread:
            del copies[next(iter(copies))]
        return own


# Recently used aggregates stay in memory and are fast-forwarded with the events
# recorded since (one cheap query, nothing to decode when nothing changed), and
# handed out as deep copies, so a failed save never pollutes the cache.
# Its size: KANDEV_AGGREGATE_CACHE_SIZE (docs/operations.md: Worker memory).
AGGREGATE_CACHE = {
    "AGGREGATE_CACHE_FASTFORWARD": "y",
    "DEEPCOPY_FROM_AGGREGATE_CACHE": "y",
}


def aggregate_cache(settings: Settings) -> dict[str, str]:
    return {**AGGREGATE_CACHE, "AGGREGATE_CACHE_MAXSIZE": str(settings.aggregate_cache_size)}


def event_store_env(settings: Settings) -> dict[str, str]:
    create = "y" if settings.create_tables else "n"
    target = settings.postgres
    if target is not None:
        # Only here: psycopg is the `postgres` extra, absent from a plain install.
        from kandev_es.storage.recorders import (
            POSTGRES_CONNINFO,
            POSTGRES_FACTORY_TOPIC,
            POSTGRES_RECORDER_TOPIC,
        )

        params = target.as_dict()
        # The library insists on these four; its pool connects with the one
        # conninfo instead (recorders.KandevPostgresFactory).
        env = {
            "POSTGRES_DBNAME": params.get("dbname", ""),
            "POSTGRES_HOST": params.get("host", params.get("hostaddr", "")),
            "POSTGRES_USER": params.get("user", ""),
            "POSTGRES_PASSWORD": params.get("password", ""),
            # Prefixed with the application's name, as the library looks it up
            # first: a stray KANDEV_POSTGRES_CONNINFO in the environment loses.
            f"KANDEV_{POSTGRES_CONNINFO}": target.conninfo,
            "POSTGRES_SCHEMA": target.schema or "",
        }
        env.update(
            PERSISTENCE_MODULE=POSTGRES_FACTORY_TOPIC,
            POSTGRES_POOL_SIZE=str(settings.pool_size),
            POSTGRES_MAX_OVERFLOW=str(settings.pool_size),
            APPLICATION_RECORDER_TOPIC=POSTGRES_RECORDER_TOPIC,
            # Also how long a call waits for a pooled connection: short, so a
            # request against a stopped database fails fast with a 503.
            POSTGRES_CONNECT_TIMEOUT=str(settings.pg_connect_timeout),
            POSTGRES_PRE_PING=settings.pg_pre_ping,
            POSTGRES_ENABLE_DB_FUNCTIONS="n",
            CREATE_TABLE=create,
        )
        env.update(aggregate_cache(settings))
        return env
    return {
        **aggregate_cache(settings),
        "PERSISTENCE_MODULE": SQLITE_FACTORY_TOPIC,
        "APPLICATION_RECORDER_TOPIC": SQLITE_RECORDER_TOPIC,
        "SQLITE_DBNAME": str(settings.sqlite_path),
        "CREATE_TABLE": create,
    }


class Tasks(Application):  # type: ignore[type-arg]
    """Identities, tasks, workspaces and tokens share one store, so a creation
    can save its Identity and Task events in one atomic ``save``."""

    name = "kandev"

    def __init__(self, settings: Settings, breaker: StoreBreaker | None = None) -> None:
        super().__init__(env=event_store_env(settings))
        # Both recorders are ours (storage/): whether a save writes chain hashes.
        self.recorder.save_chains = settings.ledger_save_chains  # type: ignore[attr-defined]
        # Sealed free text (storage/sealing.py): keys read through the recorder.
        self.keys = cast(SealingMapper, self.mapper).keys
        self.keys.reader = getattr(self.recorder, "select_task_keys", None)
        self._seal = settings.seal_free_text
        # Only PostgreSQL goes away; SQLite's errors are lock timeouts.
        if breaker is None and settings.database_url:
            from kandev_es.storage.reconnect import reconnect_quickly

            reconnect_quickly()
            breaker = StoreBreaker()
        self.breaker = breaker
        self._snapshots = ReadCache(settings.snapshot_cache_size)
        # The inline projections (projections/inline.py, set by bootstrap):
        # the read-model rows each save writes in its own transaction.
        self.inline: InlineViews | None = None
        # PostgreSQL's recorder can draw an office number inside a read
        # (``read_and_draw``); SQLite's counter row is a statement of its own.
        self.draws_with_reads = hasattr(self.recorder, "select_streams_drawing")
        # The library's save does, for us, only what ``_write`` does (see
        # there); anything that would make it do more keeps the library's save.
        self._direct_save = (
            self.snapshots is None
            and (self.repository.cache is None or self.repository.fastforward)
            and type(self)._notify is Application._notify
            and type(self).notify is Application.notify
        )
        # Background threads (an agent's reaper) may outlive the request that
        # started them; they use the store only inside ``unless_closed`` so
        # closing never pulls a connection from under them (SQLite segfaults).
        self._open_lock = threading.Condition()
        self._background_calls = 0
        self._closed = False

    def construct_mapper(self) -> SealingMapper:
        """The library's mapper, sealing each task's free text under its own
        key (storage/sealing.py; docs/auditing.md: Erasure)."""
        mapper = self.factory.mapper(self.construct_transcoder(), mapper_class=SealingMapper)
        return cast(SealingMapper, mapper)

    def construct_transcoder(self) -> Transcoder:
        """The library's JSON, encoded faster (storage/transcoder.py), unless
        the environment names another transcoder."""
        transcoder = self.factory.transcoder()
        if type(transcoder) is JSONTranscoder:
            transcoder = EventTranscoder()
        if isinstance(transcoder, JSONTranscoder):
            self.register_transcodings(transcoder)
        return transcoder

    @contextmanager
    def unless_closed(self) -> Iterator[bool]:
        """Yield True and keep close() waiting while the store is in use;
        yield False (and touch nothing) once the application is closed."""
        with self._open_lock:
            if self._closed:
                usable = False
            else:
                usable = True
                self._background_calls += 1
        try:
            yield usable
        finally:
            if usable:
                with self._open_lock:
                    self._background_calls -= 1
                    self._open_lock.notify_all()

    def close(self) -> None:
        with self._open_lock:
            self._closed = True
            self._open_lock.wait_for(lambda: self._background_calls == 0, timeout=30)
        notifier = getattr(self.recorder, "notifier", None)
        if notifier is not None:
            notifier.stop()  # its last NOTIFY, while the pool is still open
        super().close()

    @contextmanager
    def _store_call(self) -> Iterator[None]:
        """Map the library's OperationalError to a typed 503, and keep the
        breaker informed so calls after a failure answer at once."""
        breaker = self.breaker
        if breaker is None:
            try:
                yield
            except OperationalError as error:
                raise StoreUnavailable(f"event store unavailable: {error}") from None
            return
        breaker.admit()
        started = breaker.now()
        try:
            yield
        except (OperationalError, InterfaceError, StoreInternalError) as error:
            # InternalError only for a standby's read-only refusal (a failover):
            # the recorder has drained its pool; retrying later is safe.
            if isinstance(error, StoreInternalError) and not means_read_only(error):
                breaker.succeeded(started)
                raise
            if means_unreachable(error):
                breaker.failed(str(error))
            log.warning("event store call failed after %.2fs: %s", breaker.now() - started, error)
            raise StoreUnavailable(f"event store unavailable: {error}") from None
        except BaseException:
            breaker.succeeded(started)  # the store answered (a conflict, a missing aggregate)
            raise
        breaker.succeeded(started)

    def load(self, aggregate_id: uuid.UUID, kind: type[A]) -> A | None:
        try:
            with self._store_call():
                aggregate: Aggregate = self.repository.get(aggregate_id)
        except AggregateNotFoundError:
            return None
        if not isinstance(aggregate, kind):
            return None
        return aggregate

    def read(self, aggregate_id: uuid.UUID, kind: type[A]) -> A | None:
        """Like ``load`` but without a copy per call: this thread's copy of a
        current snapshot (see ``read_many``) — for reads only."""
        aggregate = self.read_many([aggregate_id])[aggregate_id]
        return aggregate if isinstance(aggregate, kind) else None

    def read_many(
        self, ids: Iterable[uuid.UUID], share: bool = True
    ) -> dict[uuid.UUID, Aggregate | None]:
        """The current state of several aggregates, for reads only, caught up
        in ONE query: the events after each cached snapshot's version (after
        version 0 for one not cached). Every id is a key of the answer; an
        aggregate with no events maps to None. Each answer is this thread's
        own object (``ReadCache.handout``), never one another thread holds.
        ``share`` False (a batch's many cold reads): what had to be caught up
        is answered as built, neither cached nor copied (a copy of each cost
        more than decoding its events again)."""
        return self._read_many(ids, None, share)[0]

    def read_and_draw(
        self,
        ids: Iterable[uuid.UUID],
        workspace_id: uuid.UUID,
        versions: Mapping[uuid.UUID, int],
    ) -> tuple[dict[uuid.UUID, Aggregate | None], int | None]:
        """``read_many``, drawing the workspace's next office number in the
        same query when nothing was read: a create whose snapshots already
        admit its claim draws its number with its lookup. ``versions``: the
        snapshot versions that admitted it (an id not named: none cached); if
        the cache has moved from them since, nothing is drawn, so the number
        is drawn only if the store is still exactly what admitted the create.
        None: nothing was drawn (something moved, or the store draws numbers
        only on their own)."""
        return self._read_many(ids, (workspace_id, versions))

    def _read_many(
        self,
        ids: Iterable[uuid.UUID],
        draw: tuple[uuid.UUID, Mapping[uuid.UUID, int]] | None,
        share: bool = True,
    ) -> tuple[dict[uuid.UUID, Aggregate | None], int | None]:
        wanted = ids if isinstance(ids, list) else list(ids)
        if not wanted:  # nothing to read (PostgreSQL's query needs at least one id)
            return {}, None
        if len(wanted) > 1 and len(set(wanted)) < len(wanted):
            wanted = list(dict.fromkeys(wanted))
        cache = self._snapshots
        snapshots = [cache.get(key) for key in wanted]
        since = [
            (key, snapshot.version if snapshot is not None else 0)
            for key, snapshot in zip(wanted, snapshots, strict=True)
        ]
        number: int | None = None
        recorder = cast(Any, self.recorder)
        if draw is not None and (
            not self.draws_with_reads
            or any(version != draw[1].get(key, 0) for key, version in since)
        ):
            draw = None  # no draws here, or a newer snapshot was cached since the admission
        with self._store_call():
            if draw is not None:
                stored, number = recorder.select_streams_drawing(since, draw[0])
            else:
                stored = recorder.select_streams(since)
        newer: dict[uuid.UUID, list[StoredEvent]] = {}
        for event in stored:
            newer.setdefault(cast(uuid.UUID, event.originator_id), []).append(event)
        with self._store_call():  # the data keys of their sealed events, in one query
            keys = self.keys.fetch(event.state for event in stored)
        with self.keys.using(keys):
            return self._caught_up(wanted, snapshots, newer, share), number

    def _caught_up(
        self,
        wanted: list[uuid.UUID],
        snapshots: list[Aggregate | None],
        newer: dict[uuid.UUID, list[StoredEvent]],
        share: bool,
    ) -> dict[uuid.UUID, Aggregate | None]:
        cache = self._snapshots
        answer: dict[uuid.UUID, Aggregate | None] = {}
        for key, snapshot in zip(wanted, snapshots, strict=True):
            events = newer.get(key)
            if events is None:  # the common case: nothing new since the last read
                answer[key] = cache.handout(key, snapshot) if snapshot is not None else None
                continue
            aggregate: Any = copy.deepcopy(snapshot) if snapshot is not None else None
            for event in events:
                aggregate = cast(Any, self.mapper.to_domain_event(event)).mutate(aggregate)
            if aggregate is not None and share and cache.put(key, aggregate):
                aggregate = cache.handout(key, aggregate)
            answer[key] = aggregate  # else never shared: this thread's alone
        return answer

    def next_office_number(self, workspace_id: uuid.UUID) -> int:
        """The workspace's next office task number (``KAN-<n>``); never reused."""
        with self._store_call():
            return int(cast(Any, self.recorder).next_office_number(workspace_id))

    def next_office_numbers(self, workspace_id: uuid.UUID, count: int) -> list[int]:
        """``count`` of the workspace's next office numbers, drawn at once
        (ascending, never reused; a batch of creates)."""
        if count <= 0:
            return []
        with self._store_call():
            return list(cast(Any, self.recorder).next_office_numbers(workspace_id, count))

    def snapshot(self, aggregate_id: uuid.UUID, kind: type[A]) -> A | None:
        """The last state ``read_many`` saw, without asking the store (it may
        be stale): for guessing which other streams to fetch in the same query.
        Like ``read``, this thread's own copy."""
        found = self._snapshots.get(aggregate_id)
        if not isinstance(found, kind):
            return None
        return cast(A, self._snapshots.handout(aggregate_id, found))

    def save(self, *objs: Any, **kwargs: Any) -> list[Recording[uuid.UUID]]:
        """The library's ``save``, through ``_write`` when saving aggregates."""
        aggregates = [obj for obj in objs if obj is not None]
        if not self._direct_save or not all(isinstance(a, Aggregate) for a in aggregates):
            if self.inline is not None:  # the library's save writes no read model
                raise InternalError("a save the inline projections cannot follow")
            # Nor any data key: its events are stored in cleartext (format 0).
            return cast(list[Recording[uuid.UUID]], super().save(*objs, **kwargs))
        events, stored, ids = self._write(aggregates, kwargs)
        if not ids:
            return []
        return [
            Recording(
                event,
                Notification(
                    originator_id=s.originator_id,
                    originator_version=s.originator_version,
                    topic=s.topic,
                    state=s.state,
                    id=n_id,
                ),
            )
            for event, s, n_id in zip(events, stored, ids, strict=True)
        ]

    def _write(
        self,
        aggregates: Sequence[Aggregate],
        kwargs: Mapping[str, Any],
        dtos: TaskDtos | None = None,
        extra_views: ViewRows | None = None,
    ) -> tuple[list[Any], list[StoredEvent], Sequence[int]]:
        """Every save's write: the aggregates' pending events, mapped and
        inserted in one recorder call. It is what the library's
        ``Application.save`` does when no snapshots are taken, the repository
        cache is fast-forwarded (so a save puts nothing in it) and the notify
        hooks are the library's no-ops (``_direct_save``), without its
        per-aggregate runtime Protocol checks (a fifth of a Created's calls).
        tests/unit/test_library_internals.py watches the library's save."""
        events: list[Any] = []
        for aggregate in aggregates:
            events.extend(aggregate.collect_events())
        mapper = cast(SealingMapper, self.mapper)
        with mapper.collecting(self._seal) as new_keys:
            stored = [mapper.to_stored_event(event) for event in events]
        try:
            # The read-model rows of these events, written by the recorder in
            # the same transaction (storage/view_writes.py), with the data
            # keys of new tasks (storage/sealing.py).
            inline = self.inline
            views = inline(events, aggregates, dtos) if inline is not None else None
            if extra_views:
                views = {**(views or {}), **extra_views}
            if new_keys:
                views = {**(views or {}), "task_keys": [
                    (str(task_id), key.hex()) for task_id, key in new_keys.items()
                ]}  # fmt: skip
            ids = self.recorder.insert_events(stored, views=views, **kwargs)
        except ViewsFailed as error:
            metrics.record_projection_failure()
            log.error("save rolled back: %s", error)
            raise ProjectionFailed("a read model refused the save; nothing was stored") from None
        return events, stored, ids or []

    @tracing.traced("save")
    def save_atomically(
        self,
        *aggregates: Aggregate,
        unchanged: Mapping[uuid.UUID, int] | None = None,
        dtos: TaskDtos | None = None,
        extra_views: ViewRows | None = None,
    ) -> int:
        """Save all pending events in one transaction; return the last
        notification id. A version clash becomes ``VersionConflict``. With
        ``unchanged`` ({aggregate id: version read}), nothing is saved — also
        ``VersionConflict`` — if any of those streams has moved on since.
        ``dtos``: saved tasks' DTOs as they are after this save, made by the
        caller anyway (its answer), so the inline views do not make them again.
        ``extra_views``: more rows for the save's transaction (a forget's)."""
        kwargs = {"unchanged": dict(unchanged)} if unchanged else {}
        if extra_views and not self._direct_save:
            raise InternalError("a save with rows of its own needs the direct save")
        try:
            with self._store_call():
                if self._direct_save:
                    ids = self._write(aggregates, kwargs, dtos, extra_views)[2]
                else:
                    ids = [r.notification.id for r in self.save(*aggregates, **kwargs)]
        except (IntegrityError, StreamsAdvanced):
            raise VersionConflict from None
        return max(ids, default=0)

    def retry_on_conflict(
        self,
        load: Callable[[], L],
        mutate: Callable[[L], R],
        *,
        attempts: int = CONFLICT_ATTEMPTS,
        contended: str = "the record keeps changing; retry",
    ) -> R:
        """Optimistic concurrency, written once: ``load`` reads afresh (an
        aggregate, None, or a tuple of them), ``mutate`` calls commands on it
        and returns the answer (or raises to stop, saving nothing); then every
        loaded aggregate with pending events is saved in one transaction
        (none pending: no write). A version clash reads again, at most
        ``attempts`` times in all, then ``Contended`` (409)."""
        for _ in range(attempts):
            loaded = load()
            answer = mutate(loaded)
            parts = loaded if isinstance(loaded, tuple) else (loaded,)
            changed = [a for a in parts if isinstance(a, Aggregate) and a.pending_events]
            if changed:
                try:
                    self.save_atomically(*changed)
                except VersionConflict:
                    continue
            return answer
        raise Contended(contended, attempts=attempts)

    def settled_rows(
        self, query: str, params: dict[str, Any]
    ) -> list[tuple[Any, ...]] | None:
        """For readers of rows saves write inline out of position order (the
        feeds): the rows of ``query`` up to a position at or above every save
        that answered before the call, and settled (``recorders.settled_rows``).
        None: no such reader here (SQLite's one writer commits in position
        order: what is visible is settled; read it in a transaction)."""
        settled_rows = getattr(self.recorder, "settled_rows", None)
        if settled_rows is None:
            return None
        with self._store_call():
            return list(settled_rows(query, params))

    def following_rows(
        self, query: str, params: dict[str, Any], watched: Mapping[uuid.UUID, int]
    ) -> Followed | None:
        """For a reader following the log a moment behind (the feed reader):
        ``query``'s rows up to a settled position in one statement, that
        position, the log's head and whether a ``watched`` aggregate moved
        past its version (``recorders.following_rows``); None where the store
        has no such reader (SQLite: use ``settled_rows``)."""
        following_rows = getattr(self.recorder, "following_rows", None)
        if following_rows is None:
            return None
        with self._store_call():
            found: Followed = following_rows(query, params, watched)
            return found

    def checkpoint(self) -> None:
        """Take a checkpoint of the log's visible head (settled.py), which a
        later settled or following read settles; nothing where the store has
        none (SQLite: what is visible is settled)."""
        checkpoint = getattr(self.recorder, "checkpoint", None)
        if checkpoint is not None:
            with self._store_call():
                checkpoint()

    def max_notification_id(self) -> int:
        with self._store_call():
            return int(self.recorder.max_notification_id() or 0)

    def originators(self, topic: str, page: int = 500) -> list[uuid.UUID]:
        """Ids of every aggregate with a notification of ``topic``, oldest first:
        a scan of the notification log for small, rarely listed kinds (tokens)."""
        found: list[uuid.UUID] = []
        start = 1
        while True:
            with self._store_call():
                batch = self.recorder.select_notifications(
                    start=start, limit=page, topics=[topic]
                )
            found.extend(uuid.UUID(str(n.originator_id)) for n in batch)
            if len(batch) < page:
                return found
            start = batch[-1].id + 1
