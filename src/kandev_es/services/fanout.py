"""One feed reader per process, fanned out to every follower of a workspace's
feed: the open SSE streams, and anything else that follows it
(docs/architecture.md: How the feed fans out).

Before, each open stream read the feed on its own at every save, and encoded
every event itself: ten streams were ten reads and ten encodings of each
event, and the writers' throughput fell to a third. Here one thread per
process (``FeedFanout``), running while any follower is at the head:

- is woken by this process's saves as they commit (``SAVES``, rung by the
  recorders), and, while none of its own comes, by the log's head moving (one
  small statement every WATCH_SECONDS while it moves, backing off to
  WATCH_IDLE_SECONDS while it is still): the saves of other workers and nodes;
  it passes at most every COALESCE_SECONDS (BUSY_COALESCE_SECONDS after a pass
  that handed events out, with a checkpoint of the head CHECKPOINT_LEAD_SECONDS
  before the next pass, which then hands out what committed until then), so the
  saves of those milliseconds share one read, and its streams are woken as
  seldom: a stream's wake and write cost its worker more than its events;
- reads each new page of the followed workspaces' feed rows once, up to the
  position its checkpoints have settled, in one statement (``FeedSource.follow``:
  no pg_locks, no waiting; the writers' settled head of services/feeds.py only at
  its first pass and when that position is held back STALL_SECONDS), asks whether
  the followers may still read (``StreamAccess``: one statement for all their
  tokens and workspaces) only when one is new or that statement says one of the
  tokens and workspaces the last answer read has a newer event, makes each
  event's JSON and SSE frame once (``FeedEvent``) and hands the same object to
  every follower of its workspace;
- never waits for a follower: one that has more than MAX_BEHIND_EVENTS or
  MAX_BEHIND_BYTES waiting is ended ``too slow`` and its queue dropped (an SSE
  client resumes with ``Last-Event-ID``, a deliverer from its stored cursor).

A follower (``Subscription``) first catches up on its own, a page at a time as
the paged feed reads (a backlog never waits in memory), and joins the reader
only once a page comes back short: the reader's next pass says from where
its queue starts, and the follower reads what lies between once more. So
every event reaches it once, in feed order, whatever the order of joins,
passes and reads.

The interface for a follower is ``FeedFanout.subscribe`` and
``Subscription.take`` / ``close``; a grant (``StreamAccess.grant``) makes it
end as soon as its token is revoked or its workspace deleted.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kandev_es import metrics
from kandev_es.application import Tasks
from kandev_es.domain.principal import principal_of
from kandev_es.domain.token import hash_token, token_id_for, well_formed
from kandev_es.domain.workspace import Workspace
from kandev_es.errors import StoreUnavailable
from kandev_es.projections.feeds import feed_source
from kandev_es.services.auth import TOKEN_PREFIX
from kandev_es.services.feeds import (
    SERVER_STOPPING,
    FeedEnded,
    SettledRows,
    on_server_stop,
)
from kandev_es.storage.database import Database
from kandev_es.storage.notifier import SAVES, SaveBell

log = logging.getLogger("kandev_es.feeds")

PAGE = 500  # feed rows a read returns at most
COALESCE_SECONDS = 0.01  # between passes, after one that found nothing
BUSY_COALESCE_SECONDS = 0.2  # after one that handed events out: saves keep coming
# ... and this long before the pass after such a wait, a checkpoint of the log's
# head: the pass then hands out what committed until then, not only what the
# pass before it saw (a row settles by a checkpoint taken after it was visible).
CHECKPOINT_LEAD_SECONDS = 0.05
WATCH_SECONDS = 0.005
WATCH_IDLE_SECONDS = 0.05
STALL_SECONDS = 0.25  # the reader's settled position held back: read to the writers' head
CHECK_SECONDS = 5.0  # every follower's grant asked again at least this often
MAX_BEHIND_EVENTS = 2000
MAX_BEHIND_BYTES = 4 << 20
NEVER = 2**63 - 1  # a position after which nothing is: a read for the head alone
# A reader's page's columns, in feed_event's order.
READER_COLUMNS = "position, workspace_id, event_id, type, subject, timestamp, data"

# A follower's right to read: its token's hash (None: a follower without a
# token, such as a deliverer the operator set up) and the workspace.
Grant = tuple[str | None, uuid.UUID]
# Why each grant may no longer read ("token revoked", "workspace deleted"), or
# None where it still may: asked afresh of the store, for all in one read.
AccessCheck = Callable[[Sequence[Grant]], list[str | None]]


@dataclass(frozen=True)
class FeedEvent:
    """One feed entry, made once per process for all its followers."""

    position: int
    workspace_id: uuid.UUID
    type: str
    text: str  # the entry's JSON, as the paged feed serves it
    frame: bytes  # its SSE frame: id (the cursor), event (the type), data

    @property
    def envelope(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.text)
        return loaded


def feed_event(row: Sequence[Any]) -> FeedEvent:
    """A FeedEvent of a reader's row (READER_COLUMNS). The task's stored JSON goes
    in as it is (it is one line); only the envelope's own fields are encoded."""
    position, workspace, event_id, kind, subject, timestamp, data = row
    workspace_id = workspace if isinstance(workspace, uuid.UUID) else uuid.UUID(str(workspace))
    head = json.dumps(
        {
            "id": str(event_id),
            "type": kind,
            "subject": str(subject),
            "source": feed_source(workspace_id),
            "timestamp": timestamp,
        }
    )
    if "\n" in data or "\r" in data:  # not one line: decoded and written again
        data = json.dumps(json.loads(data))
    text = f'{head[:-1]}, "data": {data}}}'
    frame = f"id: {position}\nevent: {kind}\ndata: {text}\n\n".encode()
    return FeedEvent(int(position), workspace_id, str(kind), text, frame)


# The reader's page on PostgreSQL: the followed workspaces' rows after its
# position up to the settled head, and that head (``upto``) even when there
# are none (Tasks.settled_rows: one statement once the saves under way ended).
SETTLED_READER_PAGE = (
    "SELECT %(upto)s::bigint AS upto, f.* FROM (SELECT 1) AS one LEFT JOIN LATERAL ("
    f" SELECT {READER_COLUMNS} FROM {{schema}}.feed_events"
    " WHERE position > %(after)s AND position <= %(upto)s"
    " AND workspace_id = ANY(%(workspaces)s::uuid[]) ORDER BY position LIMIT %(limit)s) f ON true"
)


# The reader's page when it follows the log (Tasks.following_rows): the same
# rows, bounded by the settled position that one statement finds (``b.bound``).
FOLLOWING_PAGE = (
    f"SELECT {READER_COLUMNS} FROM {{schema}}.feed_events"
    " WHERE position > %(after)s AND position <= b.bound"
    " AND workspace_id = ANY(%(workspaces)s::uuid[]) ORDER BY position LIMIT %(limit)s"
)


class FeedSource:
    """The feed rows of some workspaces after a position, only settled ones,
    and how far that read is complete (``through``: every row at or below it
    that will ever exist is visible, and was read if its workspace was asked
    for and the page was not full)."""

    def __init__(self, app: Tasks, database: Database) -> None:
        self._app = app
        self._database = database
        self._settled: SettledRows = app.settled_rows
        # The log's head: what the reader watches for other processes' saves.
        self.head: Callable[[], int] = app.max_notification_id
        # A checkpoint of that head, for the reader's next pass to settle.
        self.checkpoint: Callable[[], None] = app.checkpoint
        self.top = 0  # the log's head as the reader's last statement saw it
        self._bound = 0  # the highest settled position a following read found
        self._stalled = time.monotonic()  # when that last moved (or reached the head)

    def follow(
        self,
        after: int,
        workspaces: Collection[uuid.UUID],
        watched: Mapping[uuid.UUID, int] | None = None,
    ) -> tuple[list[FeedEvent], int, bool]:
        """The reader's read: ``read``'s answer, a moment behind the head
        (one statement, no pg_locks: ``Tasks.following_rows``), and whether
        any ``watched`` aggregate (id: version) has moved past its version
        (True when that is not known). Once the settled position has not
        moved for STALL_SECONDS while the head is ahead of it (a transaction
        with an id elsewhere in the cluster holds it back), one ``read``
        instead: its head is this table's writers'."""
        params = {"after": after, "workspaces": list(workspaces), "limit": PAGE}
        found = self._app.following_rows(FOLLOWING_PAGE, params, watched or {})
        if found is None:
            return (*self.read(after, workspaces), True)
        bound, self.top = found.bound, found.top
        now = time.monotonic()
        if bound > self._bound or bound >= self.top:
            self._bound, self._stalled = max(bound, self._bound), now
        elif now - self._stalled >= STALL_SECONDS:
            self._stalled = now
            return (*self.read(after, workspaces), True)
        events = [feed_event(row) for row in sorted(found.rows, key=lambda row: int(row[0]))]
        through = events[-1].position if len(events) >= PAGE else bound
        return events, max(through, after), found.moved or watched is None

    def read(
        self, after: int | None, workspaces: Collection[uuid.UUID], limit: int | None = None
    ) -> tuple[list[FeedEvent], int]:
        """Up to ``limit`` (PAGE) events after ``after`` and the position the
        read is complete through; ``after`` None: none, only that position."""
        limit = PAGE if limit is None else limit
        wanted = list(workspaces)
        params = {"after": NEVER if after is None else after, "workspaces": wanted,
                  "limit": limit}
        rows = self._settled(SETTLED_READER_PAGE, params)
        if rows is None:
            upto, found = self._sqlite(params)
        else:
            upto = int(rows[0][0])
            found = sorted((row[1:] for row in rows if row[1] is not None),
                           key=lambda row: int(row[0]))
        events = [feed_event(row) for row in found]
        through = events[-1].position if len(events) >= limit else upto
        return events, max(through, after or 0)

    def _sqlite(self, params: dict[str, Any]) -> tuple[int, list[tuple[Any, ...]]]:
        # One writer commits in position order: every id up to the head read
        # first is visible to the read after it, which takes no write lock.
        upto = self._app.max_notification_id()
        wanted = [str(workspace) for workspace in params["workspaces"]]
        marks = ", ".join("?" * len(wanted)) or "NULL"
        rows = self._database.read(
            f"SELECT {READER_COLUMNS} FROM feed_events WHERE position > ? AND position <= ?"
            f" AND workspace_id IN ({marks}) ORDER BY position LIMIT ?",
            (params["after"], upto, *wanted, params["limit"]),
        )
        return upto, rows


class StreamAccess:
    """Whether followers may still read their workspace's feed: the same
    checks as opening a stream (the token as any request reads it, the
    workspace not deleted), for any number of grants in one read."""

    def __init__(self, app: Tasks) -> None:
        self._app = app

    @staticmethod
    def grant(secret: str | None, workspace_id: uuid.UUID) -> Grant:
        """The grant of a bearer ``secret`` (its hash only is kept)."""
        return (hash_token(secret) if well_formed(secret, TOKEN_PREFIX) else "", workspace_id)

    def __call__(self, grants: Sequence[Grant]) -> list[str | None]:
        return self.checked(grants)[0]

    def checked(self, grants: Sequence[Grant]) -> tuple[list[str | None], dict[uuid.UUID, int]]:
        """The reasons, and the versions of the tokens and workspaces they were
        read at (0: none): the answers hold until one of them has a newer event
        (the reader asks that in its page's statement: ``FeedSource.follow``)."""
        if not grants:
            return [], {}
        ids = {token_id_for(h) for h, _ in grants if h} | {w for _, w in grants}
        found = self._app.read_many(list(ids))
        versions = {key: getattr(found.get(key), "version", 0) or 0 for key in ids}
        return self._reasons(grants, found), versions

    @staticmethod
    def _reasons(grants: Sequence[Grant], found: Mapping[uuid.UUID, Any]) -> list[str | None]:
        reasons: list[str | None] = []
        for token_hash, workspace_id in grants:
            if token_hash is not None:
                token = found.get(token_id_for(token_hash)) if token_hash else None
                who = principal_of(token, token_hash)
                if who is None or not who.may_act_on(workspace_id):
                    reasons.append("token revoked")
                    continue
            workspace = found.get(workspace_id)
            if not isinstance(workspace, Workspace) or workspace.deleted:
                reasons.append("workspace deleted")
                continue
            reasons.append(None)
        return reasons


class Subscription:
    """One follower of a workspace's feed: ``take`` hands it every event
    after ``after`` exactly once, in feed order, until it is ended."""

    def __init__(
        self, fanout: FeedFanout, workspace_id: uuid.UUID, after: int, grant: Grant | None
    ) -> None:
        self.workspace_id = workspace_id
        self.grant = grant
        self.cursor = after  # the last position handed out
        self._through = after  # every event of the workspace up to here handed out
        self._fanout = fanout
        self._condition = threading.Condition()
        self._queue: deque[FeedEvent] = deque()
        self._queued_bytes = 0
        self._at_head = False  # a read came back short: join the reader
        self._joined = False
        self._joined_at: int | None = None  # the reader's queue holds what is after
        self._ended: str | None = None

    @property
    def caught_up(self) -> bool:
        """Its own reads have reached the head; from now on the reader feeds it."""
        return self._at_head

    def take(self, timeout: float) -> list[FeedEvent]:
        """The next events, in order (none once ``timeout`` passed without
        any); FeedEnded once it has ended (revoked, deleted, too slow)."""
        if self._at_head and not self._joined:
            self._joined = True
            self._fanout._join(self)
        with self._condition:
            reading = self._must_read()
            if not reading and not self._queue:
                self._condition.wait(timeout)
                reading = self._must_read()
            if not reading:
                queued = list(self._queue)
                self._queue.clear()
                self._queued_bytes = 0
        if reading:
            return self._read(timeout)
        fresh = [event for event in queued if event.position > self._through]
        if fresh:
            self.cursor = self._through = fresh[-1].position
        return fresh

    def _must_read(self) -> bool:
        """Under the condition: whether the next events come from its own read
        (catching up, or what lies between its reads and the reader's queue)."""
        if self._ended is not None:
            raise FeedEnded(self._ended)
        if not self._joined:
            return True
        return self._joined_at is not None and self._through < self._joined_at

    def _read(self, timeout: float) -> list[FeedEvent]:
        events, through = self._fanout.source.read(self._through, (self.workspace_id,))
        if events and self.grant is not None:
            [reason] = self._fanout.access([self.grant])
            if reason is not None:
                self.end(reason)
                raise FeedEnded(reason)
        if events:
            self.cursor = events[-1].position
        self._through = max(self._through, through)
        if len(events) < PAGE:
            self._at_head = True
        if not events and self._joined_at is not None and self._through < self._joined_at:
            # The settled head has not yet reached the reader's: a moment more.
            with self._condition:
                self._condition.wait(min(timeout, WATCH_IDLE_SECONDS))
        return events

    def _joined_from(self, position: int) -> None:
        with self._condition:
            self._joined_at = position
            self._condition.notify_all()

    def offer(self, events: list[FeedEvent]) -> bool:
        """Queue ``events`` (the reader's); False, and nothing queued, when
        that would put it more than MAX_BEHIND_* behind."""
        size = sum(len(event.frame) for event in events)
        with self._condition:
            if self._ended is not None:
                return True
            if (
                len(self._queue) + len(events) > MAX_BEHIND_EVENTS
                or self._queued_bytes + size > MAX_BEHIND_BYTES
            ):
                return False
            self._queue.extend(events)
            self._queued_bytes += size
            self._condition.notify_all()
        return True

    def end(self, reason: str) -> None:
        """End it (its queue dropped); its next ``take`` raises FeedEnded."""
        with self._condition:
            if self._ended is None:
                self._ended = reason
            self._queue.clear()
            self._queued_bytes = 0
            self._condition.notify_all()
        self._fanout._leave(self)

    def close(self) -> None:
        """The follower is done: the reader forgets it."""
        self._fanout._leave(self)


class FeedFanout:
    """The feed reader of one process (module docstring). Its thread runs
    while any follower has joined it, and ends with the last one, or at once
    when the server stops (``stop``)."""

    def __init__(self, source: FeedSource, access: AccessCheck, bell: SaveBell = SAVES) -> None:
        self.source = source
        self.access = access
        self._bell = bell
        self._lock = threading.Lock()
        self._followers: dict[uuid.UUID, list[Subscription]] = {}
        self._joining: list[Subscription] = []
        self._through: int | None = None  # every followed row up to here handed out
        self._thread: threading.Thread | None = None
        self._stopped = False
        self.passes = 0  # reads of the reader, for tests and the bench
        self._busy = False  # the last pass handed out events: the next waits longer
        # The followers' grants' answers as of the last check, and the versions
        # of the tokens and workspaces that check read (None: not known, every
        # pass asks again); they hold while none of those has a newer event.
        self._verdicts: dict[Grant, str | None] = {}
        self._versions: dict[uuid.UUID, int] | None = None
        on_server_stop(self)

    def subscribe(
        self, workspace_id: uuid.UUID, after: int, grant: Grant | None = None
    ) -> Subscription:
        """A follower of ``workspace_id``'s feed after position ``after``."""
        return Subscription(self, workspace_id, after, grant)

    def followers(self) -> int:
        with self._lock:
            return len(self._joining) + sum(len(each) for each in self._followers.values())

    def running(self, wait: float = 0.0) -> bool:
        """Whether its thread still runs (after up to ``wait`` for it to end)."""
        thread = self._thread
        if thread is not None and wait:
            thread.join(wait)
        return thread is not None and thread.is_alive()

    def stop(self) -> None:
        """The server stops: every follower is ended, the thread ends."""
        with self._lock:
            self._stopped = True
            ended = [s for each in self._followers.values() for s in each] + self._joining
        for follower in ended:
            follower.end("server stopping")
        self._bell.ring()

    def _join(self, follower: Subscription) -> None:
        with self._lock:
            if self._stopped:
                follower.end("server stopping")
                return
            self._joining.append(follower)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="feed-reader", daemon=True)
                self._thread.start()
        self._bell.ring()  # its next pass takes the follower in

    def _leave(self, follower: Subscription) -> None:
        with self._lock:
            if follower in self._joining:
                self._joining.remove(follower)
            each = self._followers.get(follower.workspace_id, [])
            if follower in each:
                each.remove(follower)
                if not each:
                    del self._followers[follower.workspace_id]
            last = not (self._followers or self._joining) and self._thread is not None
        if last:
            self._bell.ring()  # the thread ends now, not at its next check

    def _idle(self) -> bool:
        """Under the lock: nothing left to read for; the thread then ends."""
        if self._stopped or not (self._followers or self._joining):
            self._thread = None
            self._through = None  # a later start reads from the head again
            return True
        return False

    def _run(self) -> None:
        watch = _Watch(self.source.head, self._bell)
        checked = time.monotonic()
        while True:
            with self._lock:
                if self._idle():
                    return
            rung = self._bell.rung  # before the read: a save during it rings again
            try:
                if time.monotonic() - checked >= CHECK_SECONDS:
                    checked = time.monotonic()
                    self._check_everyone()
                self._pass()
            except StoreUnavailable as error:
                log.warning("feed reader: %s", error)
                self._end_everyone("store unavailable")
            except Exception:  # a bug must not leave streams silent: they end
                log.exception("feed reader pass failed")
                self._end_everyone("feed reader failed")
            watch.through = self._through or 0
            self._coalesce()
            watch.wait(rung, checked + CHECK_SECONDS, self.source.top)

    def _coalesce(self) -> None:
        """The wait between passes: COALESCE_SECONDS after one that found
        nothing; BUSY_COALESCE_SECONDS after one that handed events out, with
        a checkpoint CHECKPOINT_LEAD_SECONDS before its end."""
        if not self._busy:
            SERVER_STOPPING.wait(COALESCE_SECONDS)
            return
        if SERVER_STOPPING.wait(BUSY_COALESCE_SECONDS - CHECKPOINT_LEAD_SECONDS):
            return
        if self._stopped or not (self._followers or self._joining):
            return  # nothing to read for: the thread ends at its next look
        try:
            self.source.checkpoint()
        except Exception as error:  # the store away: the next pass says so
            log.debug("feed reader checkpoint: %s", error)
        SERVER_STOPPING.wait(CHECKPOINT_LEAD_SECONDS)

    def _pass(self) -> None:
        """Read what is new for every followed workspace, page by page, and
        hand it out; take the joining followers in from this pass on."""
        with self._lock:
            joining, self._joining = self._joining, []
            after = self._through
            followed = set(self._followers) | {f.workspace_id for f in joining}
        if not followed:  # every follower left since the thread looked
            return
        self.passes += 1
        metrics.feed_read()
        if after is None:  # from the head as this table's writers settle it
            events, through = self.source.read(after, followed)
        else:
            events, through = self._follow(after, followed)
        with self._lock:
            start = through if after is None else after
            for follower in joining:
                self._followers.setdefault(follower.workspace_id, []).append(follower)
                follower._joined_from(start)
        self._busy = bool(events)
        self._hand_out(events)
        self._through = through
        while len(events) >= PAGE:
            metrics.feed_read()
            events, through = self._follow(through, followed)
            self._hand_out(events)
            self._through = through

    def _follow(self, after: int, followed: set[uuid.UUID]) -> tuple[list[FeedEvent], int]:
        events, through, moved = self.source.follow(after, followed, self._versions)
        if moved:  # a token or workspace of a follower has changed: ask again
            self._verdicts = {}
        return events, through

    def _hand_out(self, events: list[FeedEvent]) -> None:
        by_workspace: dict[uuid.UUID, list[FeedEvent]] = {}
        for event in events:
            by_workspace.setdefault(event.workspace_id, []).append(event)
        with self._lock:
            receivers = {w: list(self._followers.get(w, ())) for w in by_workspace}
        allowed = self._checked([f for each in receivers.values() for f in each])
        for workspace_id, batch in by_workspace.items():
            for follower in receivers[workspace_id]:
                if follower in allowed and not follower.offer(batch):
                    follower.end(
                        f"too slow; resume with Last-Event-ID: {follower.cursor}"
                    )
                    metrics.stream_too_slow()

    def _checked(self, followers: list[Subscription], fresh: bool = False) -> set[Subscription]:
        """The followers that may still read; the others are ended, with why.
        One read of the store for all of them (none without a grant), unless
        the last one still holds (``_verdicts``: no token or workspace it read
        has moved since, as this pass's read said, and it knew every grant)."""
        grants = list(dict.fromkeys(f.grant for f in followers if f.grant is not None))
        if grants and (fresh or any(grant not in self._verdicts for grant in grants)):
            self._ask(grants)
        allowed: set[Subscription] = set()
        for follower in followers:
            reason = self._verdicts.get(follower.grant) if follower.grant is not None else None
            if reason is None:
                allowed.add(follower)
            else:
                follower.end(reason)
        return allowed

    def _ask(self, grants: list[Grant]) -> None:
        checked = getattr(self.access, "checked", None)
        if checked is None:  # an access check that does not say what it read
            reasons, versions = self.access(grants), None
        else:
            reasons, versions = checked(grants)
        self._verdicts = dict(zip(grants, reasons, strict=True))
        self._versions = versions

    def _check_everyone(self) -> None:
        with self._lock:
            everyone = [f for each in self._followers.values() for f in each]
        self._checked(everyone, fresh=True)

    def _end_everyone(self, reason: str) -> None:
        with self._lock:
            everyone = [f for each in self._followers.values() for f in each] + self._joining
        for follower in everyone:
            follower.end(reason)


class _Watch:
    """How the reader waits between passes: for a save of this process (the
    bell), the log's head moving past what it has read (other processes'
    saves: looked at every WATCH_SECONDS while the head moves, up to
    WATCH_IDLE_SECONDS while it is still), or the time of the next check."""

    def __init__(self, head: Callable[[], int], bell: SaveBell) -> None:
        self._head = head
        self._bell = bell
        self._pause = WATCH_SECONDS
        self.through = 0

    def wait(self, rung: int, until: float, top: int = 0) -> None:
        if top > self.through:  # the last pass saw more than it could hand out
            return
        while not SERVER_STOPPING.is_set():
            left = until - time.monotonic()
            if left <= 0 or self._bell.wait(rung, min(self._pause, left)) != rung:
                return
            try:
                head = self._head()
            except Exception:  # the store away: the next pass says so
                return
            if head > self.through:
                self._pause = WATCH_SECONDS
                return
            self._pause = min(self._pause * 2, WATCH_IDLE_SECONDS)
