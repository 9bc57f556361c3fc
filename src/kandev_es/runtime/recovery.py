"""Find tenures whose lease expired, take them over at the expected version
(RecoveryClaimed: a new epoch fences the old owner) and drive them to
Completed or Aborted with the same driver the creating request uses."""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from kandev_es import metrics
from kandev_es.application import Tasks, VersionConflict
from kandev_es.creation.driver import CreationDriver, Fenced
from kandev_es.creation.steps.registry import steps_for
from kandev_es.domain.errors import DomainRuleBroken
from kandev_es.domain.identity import Identity
from kandev_es.errors import StoreUnavailable, UnknownStep
from kandev_es.observability import serving, tracing
from kandev_es.projections.runner import ProjectionRunner
from kandev_es.runtime.agents import ExitedAgents
from kandev_es.storage.database import Database

log = logging.getLogger("kandev_es.runtime")


# The longest wait between two takeovers of one creation, however many.
MAX_BACKOFF_SECONDS = 3600.0
PARKED = "parked"
ABANDONED_REASON = "recovery_attempts_exhausted"


@dataclass(frozen=True)
class Recovery:
    identity_id: uuid.UUID
    tenure: int
    epoch: int
    phase: str


@dataclass(frozen=True)
class Parked:
    """An unfinished creation the Runtime has taken over as often as it may
    and leaves alone: an operator looks at it (``kandev-es runtime --parked``)."""

    identity_id: uuid.UUID
    tenure: int
    workspace_id: str
    task_id: str
    phase: str
    epoch: int


def backoff_seconds(epoch: int, base: float) -> float:
    """How long past its lease a tenure taken over ``epoch`` times waits for
    its next takeover: none for the first (its owner died), then the base,
    doubling with each takeover, at most MAX_BACKOFF_SECONDS."""
    if epoch <= 0:
        return 0.0
    return float(min(base * 2 ** min(epoch - 1, 32), MAX_BACKOFF_SECONDS))


class Runtime:
    """Its parts are handed in (``Services.runtime`` in bootstrap wires them):
    the runtime knows nothing of the composition root.

    Bounded: one creation is taken over at most ``attempts`` times (its epoch),
    each takeover after the lease plus ``backoff_seconds(epoch)``. The last
    takeover of a creation still preparing does not run its steps again: it
    aborts it (Aborting ``recovery_attempts_exhausted``), compensates and frees
    the identity. One that is still unfinished after its last takeover
    (compensation or completion could not be done) is parked: never taken over
    again, logged at ERROR, counted (``kandev_runtime_recoveries_total
    {result="parked"}``) and listed by ``parked()``. A failure while
    recovering one creation is logged and the scan goes on with the next."""

    def __init__(
        self,
        app: Tasks,
        database: Database,
        projections: ProjectionRunner,
        driver: CreationDriver,
        lease_seconds: float,
        agents: ExitedAgents,
        owner_id: str | None = None,
        *,
        attempts: int = 5,
        backoff_base_seconds: float = 5.0,
    ) -> None:
        self._app = app
        self._database = database
        self._projections = projections
        self._driver = driver
        self._lease = timedelta(seconds=lease_seconds)
        self._agents = agents
        self._attempts = attempts
        self._backoff = backoff_base_seconds
        self.owner_id = owner_id or f"runtime:{socket.gethostname()}:{os.getpid()}"
        self._stop = threading.Event()

    def _due(self, lease_expires_at: datetime, epoch: int, now: datetime) -> bool:
        """Taken over fewer times than allowed, and its lease and backoff have run out."""
        wait = timedelta(seconds=backoff_seconds(epoch, self._backoff))
        return epoch < self._attempts and lease_expires_at + wait < now

    def expired_candidates(self, now: datetime) -> list[tuple[uuid.UUID, int]]:
        self._projections.catch_up()
        with self._database.transaction() as tx:
            rows = tx.execute(
                "SELECT identity_id, tenure, epoch, lease_expires_at FROM creations_view"
                " WHERE lease_expires_at < ? AND epoch < ? ORDER BY lease_expires_at",
                (now.timestamp(), self._attempts),
            )
        return [
            (uuid.UUID(str(identity)), int(tenure))
            for identity, tenure, epoch, expires in rows
            if self._due(datetime.fromtimestamp(float(expires), UTC), int(epoch), now)
        ]

    def parked(self) -> list[Parked]:
        """Unfinished creations taken over ``attempts`` times: left to an operator."""
        self._projections.catch_up()
        with self._database.transaction() as tx:
            rows = tx.execute(
                "SELECT identity_id, tenure, workspace_id, task_id, phase, epoch"
                " FROM creations_view WHERE epoch >= ? ORDER BY lease_expires_at",
                (self._attempts,),
            )
        return [
            Parked(uuid.UUID(str(i)), int(n), str(w), str(t), str(phase), int(epoch))
            for i, n, w, t, phase, epoch in rows
        ]

    def recover_once(self) -> list[Recovery]:
        """One scan: every expired tenure this runtime wins is driven to the end.
        One creation's failure never stops the others: it is logged (and, at
        its last takeover, parked) and the scan goes on. Only a store outage
        ends the scan early (every other creation would meet it too)."""
        done = []
        now = datetime.now(UTC)
        for identity_id, number in self.expired_candidates(now):
            try:
                recovery = self._take_over(identity_id, number, now)
            except StoreUnavailable:
                raise
            except Exception as error:
                self._failed(identity_id, number, error)
                continue
            if recovery is not None:
                done.append(recovery)
        return done

    def _failed(self, identity_id: uuid.UUID, number: int, error: Exception) -> None:
        try:
            identity = self._app.load(identity_id, Identity)
        except StoreUnavailable:
            raise
        except Exception:  # unreadable: reported below as a failed takeover
            identity = None
        tenure = identity.tenures.get(number) if identity is not None else None
        epoch = tenure.epoch if tenure is not None else 0
        if tenure is not None and tenure.in_flight and epoch >= self._attempts:
            metrics.record_recovery(PARKED)
            log.error(
                "creation parked after %s takeovers: identity=%s tenure=%s phase=%s: %r;"
                " the Runtime leaves it to an operator (kandev-es runtime --parked)",
                epoch, identity_id, number, tenure.phase, error,
            )
            return
        metrics.record_recovery("failed")
        log.warning(
            "recovering identity=%s tenure=%s failed at takeover %s of %s: %r;"
            " retried after %.0f s",
            identity_id, number, epoch, self._attempts, error,
            self._lease.total_seconds() + backoff_seconds(epoch, self._backoff),
        )

    def _take_over(self, identity_id: uuid.UUID, number: int, now: datetime) -> Recovery | None:
        identity = self._app.load(identity_id, Identity)
        if identity is None:
            return None
        tenure = identity.tenure(number)
        # The read model may lag: the event store decides.
        if not tenure.in_flight or not self._due(tenure.lease_expires_at, tenure.epoch, now):
            return None
        try:
            steps_for(tenure.plan)
        except UnknownStep:
            # Planned by a newer version: left, untouched, for a runtime that knows it.
            return None
        # Done for the request that claimed it (unless a request of its own
        # asked for it): its log lines carry that id, its trace links to the
        # claiming request's trace.
        acting_for = serving.current_request_id() or tenure.request_id
        with serving.acting_for(acting_for), tracing.linked(
            "recover", tenure.traceparent, **{"kandev.identity": str(identity_id)}
        ):
            return self._recover(identity, number, now)

    def _recover(self, identity: Identity, number: int, now: datetime) -> Recovery | None:
        identity_id = identity.id
        try:
            epoch = identity.recover(
                number, self.owner_id, now + self._lease, serving.current_request_id()
            )
            self._app.save_atomically(identity)
        except (VersionConflict, DomainRuleBroken):
            return None  # another runtime, or the owner, got there first
        log.info("recovering identity=%s tenure=%s epoch=%s", identity_id, number, epoch)
        try:
            if epoch >= self._attempts:
                # The last takeover: a creation still preparing is given up.
                outcome = self._driver.abandon(identity_id, number, epoch, ABANDONED_REASON)
            else:
                outcome = self._driver.drive(identity_id, number, epoch)
        except Fenced:
            metrics.record_recovery("fenced")
            return None  # a later runtime took over from us in turn
        metrics.record_recovery(outcome.tenure.phase)
        log.info(
            "recovered identity=%s tenure=%s phase=%s", identity_id, number, outcome.tenure.phase
        )
        return Recovery(identity_id, number, epoch, outcome.tenure.phase)

    def revoke_exited_agents(self) -> list[str]:
        """Revoke the run credential of every agent seen to have exited."""
        return self._agents.revoke_exited()

    def run_forever(self, poll_seconds: float) -> None:
        while not self._stop.is_set():
            # Each part on its own: a failed recovery scan never skips revoking.
            for part in (self.recover_once, self.revoke_exited_agents):
                try:
                    part()
                except StoreUnavailable as error:  # an outage, already logged by the store
                    log.warning("runtime %s skipped: %s", part.__name__, error)
                except Exception:  # keep going; the next scan retries
                    log.exception("runtime %s failed", part.__name__)
            self._stop.wait(poll_seconds)

    def stop(self) -> None:
        self._stop.set()

