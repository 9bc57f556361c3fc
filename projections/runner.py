"""Our own projection loop: read a batch of notifications after the
tracked position, apply them and store the new position in one transaction;
then sleep until a NOTIFY (PostgreSQL) or a short timeout, and start again.
Only one process per database runs that loop (projections/leadership.py);
explicit calls (``catch_up``, ``run_once``) work in any process.
Any database error is logged once per outage and retried with backoff, so the
loop outlives a lost connection or a database restart."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, cast

from kandev_es.projections.base import BatchProjection, Projection, known_topics, resolvable
from kandev_es.projections.leadership import RETRY_SECONDS, make_leadership
from kandev_es.projections.wakeup import Waker, make_waker

from kandev_es import loops, metrics
from kandev_es.application import Tasks
from kandev_es.errors import StoreUnavailable
from kandev_es.observability import tracing
from kandev_es.storage.database import Database, Transaction
from kandev_es.storage.settled import Settled

log = logging.getLogger("kandev_es.projections")
MAX_BACKOFF_SECONDS = 5.0
CATCH_UP_SECONDS = 60.0
UNSETTLED_POLL_SECONDS = 0.02
# After a pass that read less than a full batch, the loop waits this long
# before the next one, so a pass under load applies the events of several
# saves at once instead of one or two: each pass costs a checkpoint and a
# transaction per projection whatever it reads. Bounds the lag it adds.
GATHER_SECONDS = 0.005
# While the head has not moved since a pass that left every projection there,
# a pass only reads the head; a full look still happens this often, so a
# tracking row changed by hand elsewhere is noticed.
IDLE_RECHECK_SECONDS = 1.0
# An inline projection (``inline = True``: written in each save's transaction,
# projections/inline.py) is never applied here; a pass only moves its tracked
# position up to the settled head, at most this often, so the tracking rows
# say how far the read models are complete without a commit per pass: at most
# one write transaction a second, none while nothing is saved.
INLINE_TRACKING_SECONDS = 1.0


def is_inline(projection: Projection) -> bool:
    """Written in each save's transaction (projections/inline.py), not here."""
    return bool(getattr(projection, "inline", False))


class ProjectionRunner:
    def __init__(
        self,
        app: Tasks,
        database: Database,
        projections: Sequence[Projection],
        batch_size: int = 500,
    ) -> None:
        self.app = app
        self.database = database
        self.projections = list(projections)
        self._batch_size = batch_size
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.waker: Waker | None = None
        self.leading = False  # this process's background loop holds the lead
        self.failures: dict[str, Exception] = {}
        self.head = 0
        self.reached: dict[str, int] = {}  # tracking name -> position after its last pass
        # Events decoded in the current pass, by notification id: projections
        # reading the same topics (identities and creations; tasks and feeds)
        # decode each event once. Only inside run_once; projections never
        # change an event. Per thread: a rebuild applies from its own thread.
        self._pass = threading.local()
        self._idle_head: int | None = None  # head all projections reached, last full pass
        self._idle_until = 0.0
        self._inline_written = 0.0  # when inline positions were last written
        self._inline_due = False  # an inline position moved and is not written yet
        self._inline_position = 0  # the position last written for them
        notifier = getattr(app.recorder, "notifier", None)
        if notifier is not None and self.asynchronous():
            notifier.enabled = True  # this loop applies events: saves wake it
        # Tracking name -> why it stopped: an event of a topic this version
        # does not know (a newer writer's). /readyz reports it.
        self.stopped: dict[str, str] = {}
        self._known: set[str] | None = None

    def asynchronous(self) -> bool:
        """Whether some projection is applied by this loop (not inline)."""
        return not all(is_inline(p) for p in self.projections)

    def get(self, name: str) -> Projection:
        for projection in self.projections:
            if projection.name == name:
                return projection
        raise KeyError(name)

    def position(self, name: str) -> int:
        with self.database.transaction() as tx:
            rows = tx.execute("SELECT position FROM projection_tracking WHERE name = ?", (name,))
        return int(rows[0][0]) if rows else 0

    def lag(self) -> dict[str, int]:
        """Events committed but not yet in each read model: none for an
        inline projection (its rows commit with their events)."""
        head = self.app.max_notification_id()
        return {
            p.name: 0 if is_inline(p) else max(head - self.position(p.name), 0)
            for p in self.projections
        }

    def run_once(self, raise_errors: bool = True) -> int:
        """Apply one batch to every projection; return how many events were read.
        A failing projection never holds the others back: each gets its pass,
        and the failures are raised (or kept in ``failures``) afterwards."""
        read = 0
        failures: dict[str, Exception] = {}
        with self._lock:
            try:
                self.head = self.checkpoint()
            except Exception as error:
                failures["checkpoint"] = error
            if not failures and self._idle(time.monotonic()):
                return 0
            self._idle_head = None
            head = self.head
            self._pass.decoded = {}
            # One span for a pass that applies something, none for one that only looks.
            with tracing.Job("projections") as self._pass.job:
                try:
                    for projection in self.projections:
                        if is_inline(projection):
                            continue
                        try:
                            with self.database.transaction() as tx:
                                read += self.apply_pending(
                                    tx, projection, projection.name, self._batch_size
                                )
                        except Exception as error:
                            failures[projection.name] = error
                    if not failures:
                        self._track_inline(failures)
                finally:
                    self._pass.decoded = self._pass.job = None
        for name in set(self.failures) - set(failures):
            log.info("projection %s recovered", name)
        for name in set(failures) - set(self.failures):
            log.warning("projection %s failed (%s); retrying", name, failures[name])
        self.failures = failures
        if not failures and not self._below(head):
            self._idle_head, self._idle_until = head, time.monotonic() + IDLE_RECHECK_SECONDS
        if failures and raise_errors:
            raise next(iter(failures.values()))
        return read

    def _idle(self, now: float) -> bool:
        """Nothing to apply: the head is where the last full pass left every
        projection. An event committing later takes a higher id (one below the
        head still open would have kept a projection below it), so the head
        moves first."""
        if self._inline_due and now >= self._inline_written + INLINE_TRACKING_SECONDS:
            return False
        return self._idle_head == self.head and now < self._idle_until

    def _working(self) -> None:
        """This thread's pass does something: its span, if traces are on."""
        job: tracing.Job | None = getattr(self._pass, "job", None)
        if job is not None:
            job.working()

    def _track_inline(self, failures: dict[str, Exception]) -> None:
        """Move the inline projections' positions to the settled head: every
        event up to there is in their read models (written with it)."""
        inline = [p.name for p in self.projections if is_inline(p)]
        if not inline:
            return
        try:
            settled = cast(Any, self.app.recorder).read_settled(self.head, 0).position
        except Exception as error:
            failures["inline"] = error
            return
        for name in inline:
            self.reached[name] = max(self.reached.get(name, 0), settled)
        self._inline_due = settled > self._inline_position
        now = time.monotonic()
        if not self._inline_due or now < self._inline_written + INLINE_TRACKING_SECONDS:
            return
        marks = ", ".join("?" for _ in inline)
        self._working()
        try:
            with (
                tracing.span("inline positions", **{"kandev.position": settled}),
                self.database.transaction() as tx,
            ):
                moved = tx.execute(
                    "UPDATE projection_tracking SET position = ?"
                    f" WHERE name IN ({marks}) AND position < ? RETURNING name",
                    (settled, *inline, settled),
                )
        except Exception as error:
            failures["inline"] = error
            return
        if moved:
            metrics.record_background_write("projections")
        self._inline_written, self._inline_due = now, False
        self._inline_position = settled

    def checkpoint(self) -> int:
        """Let the store note how far the log has grown (before any tracking
        row is locked: see storage/settled.py); returns the visible head."""
        return int(cast(Any, self.app.recorder).checkpoint())

    def behind(self) -> bool:
        """Whether some projection stopped below the head seen by the last
        pass: events there are waiting for an older transaction to end."""
        return self._below(self.head)

    def _below(self, target: int) -> bool:
        """Whether some projection's last pass left it below ``target``. One
        without a pass yet (its first one failed) does not count: a failure has
        its own retry. After a pass without failures every projection has one."""
        return any(self.reached.get(p.name, target) < target for p in self.projections)

    def catch_up(self, timeout: float = CATCH_UP_SECONDS) -> int:
        """Apply everything committed before the call; return how many events
        were read (summed over projections). Waits while an older transaction
        is still open (its events may take lower ids), up to ``timeout``. Ends
        once every projection is at the call's head: chasing events saved
        later would never end while writes go on."""
        deadline = time.monotonic() + timeout
        target = self.app.max_notification_id()
        read = total = self.run_once()
        pause = 0.005
        while self._below(target):
            if not read:
                if time.monotonic() > deadline or self._stop.wait(pause):
                    raise StoreUnavailable("projections did not settle: a transaction is open")
                pause = min(pause * 2, 0.2)
            read = self.run_once()
            total += read
        return total

    def apply_pending(
        self,
        tx: Transaction,
        projection: Projection,
        tracking: str,
        limit: int,
        writes_paused: bool = False,
    ) -> int:
        """Inside ``tx``: apply up to ``limit`` events after the position tracked
        under ``tracking`` and advance it. Returns how many events were read.
        ``writes_paused``: no save can be under way (``tx`` holds the events
        table: a rebuild's switch), so every event is read, settled or not."""
        topics: Sequence[str] = getattr(projection, "topics", ())
        recorder = cast(Any, self.app.recorder)
        if writes_paused:
            return self._apply_all(tx, projection, tracking, limit, topics)
        # Look before locking: an idle pass (nothing settled after the tracked
        # position) then neither locks nor writes the tracking row. On PostgreSQL
        # a row lock gives the transaction an id, so every idle pass of every
        # runner would otherwise end in a WAL flush.
        seen, peeked = self._peek(tx, tracking, limit, topics)
        idle = peeked is not None and not peeked.notifications and peeked.position <= (seen or 0)
        if seen is not None and idle:
            self.reached[tracking] = seen
            return 0
        lock = " FOR UPDATE" if self.database.backend == "postgres" else ""
        # Runners in several processes serialise on the tracking row, so an
        # event is never applied twice.
        rows = tx.execute(
            "SELECT position FROM projection_tracking WHERE name = ?" + lock, (tracking,)
        )
        position = int(rows[0][0])
        # Only settled events: nothing at or below the settled position can
        # still commit, so moving there never skips one (storage/settled.py).
        # What was peeked from the same position still holds: settled events
        # never change.
        settled: Settled = (
            peeked
            if peeked is not None and position == seen
            else recorder.read_settled(position, limit, list(topics))
        )
        notifications = settled.notifications
        if len(notifications) == limit:
            new_position = notifications[-1].id
        else:  # all there is up to the settled position: skip what is ignored
            new_position = max(position, settled.position)
        stop = self._unknown_after(tracking, position, new_position)
        if stop is not None:  # never past it: a pause, never a hole
            notifications = [n for n in notifications if n.id < stop]
            new_position = stop - 1
        if notifications:
            self._apply(tx, projection, notifications)
        if new_position != position:
            tx.execute(
                "UPDATE projection_tracking SET position = ? WHERE name = ?",
                (new_position, tracking),
            )
        self.reached[tracking] = new_position
        return len(notifications)

    def _peek(
        self, tx: Transaction, tracking: str, limit: int, topics: Sequence[str]
    ) -> tuple[int | None, Settled | None]:
        """The position tracked under ``tracking`` and what is settled after it,
        read without locking the row; (None, None) when nothing is tracked yet
        (the row is made here, at position 0)."""
        rows = tx.execute("SELECT position FROM projection_tracking WHERE name = ?", (tracking,))
        if not rows:
            tx.execute(
                "INSERT INTO projection_tracking (name, position) VALUES (?, 0)"
                " ON CONFLICT (name) DO NOTHING",
                (tracking,),
            )
            return None, None
        seen = int(rows[0][0])
        return seen, cast(Any, self.app.recorder).read_settled(seen, limit, list(topics))

    def _apply_all(
        self,
        tx: Transaction,
        projection: Projection,
        tracking: str,
        limit: int,
        topics: Sequence[str],
    ) -> int:
        recorder = cast(Any, self.app.recorder)
        rows = tx.execute("SELECT position FROM projection_tracking WHERE name = ?", (tracking,))
        position = int(rows[0][0]) if rows else 0
        head = int(recorder.max_notification_id() or 0)
        notifications = list(
            recorder.select_notifications(position + 1, limit, topics=list(topics))
        )
        new_position = notifications[-1].id if len(notifications) == limit else max(head, position)
        stop = self._unknown_after(tracking, position, new_position)
        if stop is not None:
            notifications = [n for n in notifications if n.id < stop]
            new_position = stop - 1
        if notifications:
            self._apply(tx, projection, notifications)
        tx.execute(
            "INSERT INTO projection_tracking (name, position) VALUES (?, ?)"
            " ON CONFLICT (name) DO UPDATE SET position = excluded.position",
            (tracking, new_position),
        )
        self.reached[tracking] = new_position
        return len(notifications)

    def _unknown_after(self, tracking: str, position: int, upto: int) -> int | None:
        """The id of the first event in (position, upto] whose topic this
        version does not know, if any. A projection reads only its own topics,
        so without this look it would move past an event a newer version wrote
        for it and leave a hole in its read model for good; it stops there
        instead, logs why at ERROR and /readyz says so, until a version that
        knows the topic runs it."""
        if upto <= position:
            return None
        if self._known is None:
            self._known = known_topics()
        recorder = cast(Any, self.app.recorder)
        while (found := recorder.first_unknown(position, upto, sorted(self._known))) is not None:
            number, topic = found
            if resolvable(topic):  # an old name of a known class, say
                self._known.add(topic)
                continue
            reason = (
                f"stopped before event {number}: its topic {topic!r} is unknown to this"
                " version (written by a newer one); run a version that knows it"
            )
            if self.stopped.get(tracking) != reason:
                log.error("projection %s %s", tracking, reason)
            self.stopped[tracking] = reason
            return int(number)
        self.stopped.pop(tracking, None)
        return None

    def _decoded(self, notifications: list[Any]) -> list[tuple[Any, int]]:
        """Each notification's domain event (decoded once a pass), the data
        keys of the sealed ones read in one query."""
        decoded: dict[int, Any] | None = getattr(self._pass, "decoded", None)
        if decoded is None:  # outside a pass: nothing shared
            decoded = {}
        fresh = [n for n in notifications if n.id not in decoded]
        with self.app.keys.reading(n.state for n in fresh):
            for n in fresh:
                decoded[n.id] = self.app.mapper.to_domain_event(n)
        return [(decoded[n.id], n.id) for n in notifications]

    def _apply(self, tx: Transaction, projection: Projection, notifications: Any) -> None:
        backend = self.database.backend
        items = self._decoded(list(notifications))
        self._working()
        with tracing.span(f"projection {projection.name}", **{"kandev.events": len(items)}):
            if isinstance(projection, BatchProjection):
                projection.apply_batch(tx, items, backend)
            else:
                for event, position in items:
                    projection.apply(tx, event, position, backend)

    def run_forever(self, poll_seconds: float) -> None:
        """The background loop. It does passes only while this process leads
        the database's projections (projections/leadership.py); otherwise it
        asks for the lead again every ``RETRY_SECONDS``, and does nothing else."""
        leadership = make_leadership(self.database)
        waker: Waker | None = None
        streak = 0
        pause = UNSETTLED_POLL_SECONDS
        following = False
        try:
            while not self._stop.is_set():
                if not leadership.hold():
                    if waker is not None:
                        self._step_down(waker)
                        waker = None
                    if not following:
                        log.info("projections: another process leads; taking over if it stops")
                    following = True
                    self._stop.wait(RETRY_SECONDS)
                    continue
                following = False
                if waker is None:
                    waker = self._take_lead()
                read = self.run_once(raise_errors=False)
                if self.failures and len(self.failures) >= len(self.projections):
                    streak += 1  # nothing works (the database is gone?): back off
                    self._stop.wait(min(poll_seconds * 2**streak, MAX_BACKOFF_SECONDS))
                    continue
                streak = 0
                behind = not read and self.behind()
                if not behind:
                    pause = UNSETTLED_POLL_SECONDS
                if read:
                    if read < self._batch_size:
                        self._stop.wait(GATHER_SECONDS)
                    continue
                if not self.asynchronous():
                    # Nothing to apply: a pass only moves the inline positions,
                    # at most every INLINE_TRACKING_SECONDS; waking sooner
                    # would only read the head again.
                    waker.wait(max(poll_seconds, INLINE_TRACKING_SECONDS), self._stop)
                elif behind and pause < poll_seconds:
                    # Events above the settled position wait for an older
                    # transaction, which may not NOTIFY when it ends: look again soon.
                    self._stop.wait(pause)
                    pause *= 2
                else:
                    waker.wait(poll_seconds, self._stop)
        finally:
            if waker is not None:
                self._step_down(waker)
            leadership.release()

    def _take_lead(self) -> Waker:
        self.waker = make_waker(self.app, self.database)  # only the leader listens
        self.leading = True
        metrics.projection_leadership(True)
        log.info("projections: this process leads the projection loop")
        return self.waker

    def _step_down(self, waker: Waker) -> None:
        waker.close()
        self.leading = False
        metrics.projection_leadership(False)
        log.info("projections: this process no longer leads the projection loop")

    def start_thread(self, poll_seconds: float) -> threading.Thread:
        self._stop.clear()
        return loops.start(self.run_forever, "projections", self._threads, (poll_seconds,))

    def stop(self) -> None:
        """Stop the loop and wait for it: the store may be closed after."""
        loops.stop(self._stop, self._threads)
