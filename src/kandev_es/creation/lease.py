"""An owner's hold on a creation while its steps run: the lease, renewed in
the event store while a step works (a heartbeat), fenced by epoch.

The lease is the tenure's ``lease_expires_at`` in the identity's stream. The
owner (the creating request at epoch 0, a Runtime after a takeover) writes it
with every step record; while one step runs, ``Lease.renewing`` keeps a
thread that saves ``LeaseRenewed`` every third of the lease. A renewal is a
save at the stream's expected version, like the Runtime's ``RecoveryClaimed``:
of a renewal and a takeover racing, exactly one is stored. So a live owner is
never taken over, and a takeover that won makes the owner's next renewal fail:
the lease is then *lost*, and the step is told to stop (``lost``, which git
commands watch) and to make no further effect (``check``).

The thread is bounded by the step: it is started when the step starts and
stopped and joined before the step's result is recorded, in the thread that
runs the step (a request's or the Runtime's); it never outlives the step. It
saves through the driver's own ``Identity`` only while the driver waits for
the step; a save that failed leaves that object behind the store (its
version is spent, the event lost), so the driver re-reads instead of saving
it (``stale``). A step shorter than a third of the lease renews nothing."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from kandev_es import metrics
from kandev_es.application import Tasks, VersionConflict
from kandev_es.domain.identity import Identity
from kandev_es.errors import InternalError

log = logging.getLogger("kandev_es.creation")

# A renewal every third of the lease (Kubernetes' Lease objects): two thirds of
# it are left for a slow store before the lease runs out.
RENEWALS_PER_LEASE = 3
# The saves one renewal tries when someone else wrote the stream meanwhile.
RENEWAL_ATTEMPTS = 3


class LeaseLost(InternalError):
    """Another epoch owns the tenure now (or it has ended): the step must make
    no further effect; the new owner compensates or completes what is there."""


class Lease:
    """The hold of the owner at ``epoch`` on one tenure, for one drive."""

    def __init__(
        self, app: Tasks, identity_id: uuid.UUID, number: int, epoch: int, seconds: float
    ) -> None:
        self._app = app
        self.identity_id = identity_id
        self.number = number
        self.epoch = epoch
        self.seconds = seconds
        self.lost = threading.Event()
        self.renewals = 0
        # True once a renewal's save failed: the driver's Identity is behind.
        self.stale = False
        self._identity: Identity | None = None
        self._lock = threading.Lock()
        self._held_until = 0.0  # monotonic: when the last saved lease runs out

    def held_from(self, started: float) -> None:
        """The owner saved its lease (a step record) at or after ``started``
        (``time.monotonic()``): held for one lease from then."""
        self._held_until = started + self.seconds

    @contextmanager
    def renewing(self, identity: Identity) -> Iterator[None]:
        """Renew the lease every third of it while the block (one step) runs,
        through ``identity`` (the driver's, untouched by it meanwhile)."""
        self._identity, self.stale = identity, False
        stop = threading.Event()
        beat = threading.Thread(target=self._beat, args=(stop,), name="lease", daemon=True)
        beat.start()
        try:
            yield
        finally:
            stop.set()
            beat.join()
            with self._lock:
                self._identity = None

    def check(self) -> None:
        """Before a step makes an effect visible: raise ``LeaseLost`` unless the
        lease is held for at least a third of it more. A lease that has run
        (nearly) out -- the owner was paused, the store was slow -- is renewed
        first, fenced: a takeover meanwhile makes that fail."""
        if self.lost.is_set():
            raise LeaseLost("the creation's lease was lost to a newer owner")
        if time.monotonic() + self.seconds / RENEWALS_PER_LEASE < self._held_until:
            return
        self.renew()

    def renew(self) -> None:
        """Save a LeaseRenewed at the stream's version; ``LeaseLost`` (and
        ``lost`` set) when the epoch moved or the tenure ended."""
        with self._lock:
            for _ in range(RENEWAL_ATTEMPTS):
                identity = self._current()
                tenure = identity.tenures.get(self.number)
                if tenure is None or tenure.epoch != self.epoch or not tenure.in_flight:
                    self._lose()  # counted and logged once
                    raise LeaseLost(f"tenure {self.number} is no longer held at {self.epoch}")
                started = time.monotonic()
                identity.renew_lease(
                    self.number, self.epoch, datetime.now(UTC) + timedelta(seconds=self.seconds)
                )
                try:
                    self._app.save_atomically(identity)
                except VersionConflict:
                    self._drop()  # someone wrote first: read again, look at the epoch
                    continue
                except BaseException:
                    self._drop()  # stored or not, nobody can tell: read again next time
                    raise
                self._held_until = started + self.seconds
                self.renewals += 1
                metrics.record_lease_renewal("renewed")
                return
        raise VersionConflict("the identity kept changing while renewing its lease")

    def _current(self) -> Identity:
        if self._identity is None:
            identity = self._app.load(self.identity_id, Identity)
            if identity is None:
                raise LeaseLost("the identity is gone")
            self._identity, self.stale = identity, True  # not the driver's: it is behind
        return self._identity

    def _lose(self) -> None:
        if not self.lost.is_set():
            metrics.record_lease_renewal("lost")
            log.warning(
                "creation identity=%s tenure=%s lost its lease at epoch %s while a step ran;"
                " stopping the step", self.identity_id, self.number, self.epoch,
            )
        self.lost.set()

    def _drop(self) -> None:
        self._identity = None
        self.stale = True

    def _beat(self, stop: threading.Event) -> None:
        interval = self.seconds / RENEWALS_PER_LEASE
        while not stop.wait(interval):
            try:
                self.renew()
            except LeaseLost:
                return
            except Exception as error:  # the store is away: the next beat tries again
                log.warning("renewing the lease of identity=%s failed: %r", self.identity_id, error)
