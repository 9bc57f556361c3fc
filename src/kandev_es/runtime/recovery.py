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
from kandev_es.domain.errors import DomainRuleBroken
from kandev_es.domain.identity import Identity
from kandev_es.errors import StoreUnavailable
from kandev_es.projections.runner import ProjectionRunner
from kandev_es.runtime.agents import ExitedAgents
from kandev_es.storage.database import Database

log = logging.getLogger("kandev_es.runtime")


@dataclass(frozen=True)
class Recovery:
    identity_id: uuid.UUID
    tenure: int
    epoch: int
    phase: str


class Runtime:
    """Its parts are handed in (``Services.runtime`` in bootstrap wires them):
    the runtime knows nothing of the composition root."""

    def __init__(
        self,
        app: Tasks,
        database: Database,
        projections: ProjectionRunner,
        driver: CreationDriver,
        lease_seconds: float,
        agents: ExitedAgents,
        owner_id: str | None = None,
    ) -> None:
        self._app = app
        self._database = database
        self._projections = projections
        self._driver = driver
        self._lease = timedelta(seconds=lease_seconds)
        self._agents = agents
        self.owner_id = owner_id or f"runtime:{socket.gethostname()}:{os.getpid()}"
        self._stop = threading.Event()

    def expired_candidates(self, now: datetime) -> list[tuple[uuid.UUID, int]]:
        self._projections.catch_up()
        with self._database.transaction() as tx:
            rows = tx.execute(
                "SELECT identity_id, tenure FROM creations_view WHERE lease_expires_at < ?"
                " ORDER BY lease_expires_at",
                (now.timestamp(),),
            )
        return [(uuid.UUID(str(identity)), int(tenure)) for identity, tenure in rows]

    def recover_once(self) -> list[Recovery]:
        """One scan: every expired tenure this runtime wins is driven to the end."""
        done = []
        now = datetime.now(UTC)
        for identity_id, number in self.expired_candidates(now):
            recovery = self._take_over(identity_id, number, now)
            if recovery is not None:
                done.append(recovery)
        return done

    def _take_over(self, identity_id: uuid.UUID, number: int, now: datetime) -> Recovery | None:
        identity = self._app.load(identity_id, Identity)
        if identity is None:
            return None
        tenure = identity.tenure(number)
        # The read model may lag: the event store decides.
        if not tenure.in_flight or tenure.lease_expires_at > now:
            return None
        try:
            epoch = identity.recover(number, self.owner_id, now + self._lease)
            self._app.save_atomically(identity)
        except (VersionConflict, DomainRuleBroken):
            return None  # another runtime, or the owner, got there first
        log.info("recovering identity=%s tenure=%s epoch=%s", identity_id, number, epoch)
        try:
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
            try:
                self.recover_once()
                self.revoke_exited_agents()
            except StoreUnavailable as error:  # an outage, already logged once by the store
                log.warning("recovery scan skipped: %s", error)
            except Exception:  # keep recovering; the next scan retries
                log.exception("recovery scan failed")
            self._stop.wait(poll_seconds)

    def stop(self) -> None:
        self._stop.set()

