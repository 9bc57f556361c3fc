"""Find tenures whose lease expired, take them over at the expected version
(RecoveryClaimed: a new epoch fences the old owner) and drive them to
Completed or Aborted with the same driver the creating request uses."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from kandev_es import metrics
from kandev_es.application import Tasks, VersionConflict
from kandev_es.creation.driver import MAX_RESUMES, CreationDriver, Fenced
from kandev_es.creation.steps.registry import steps_for
from kandev_es.domain.errors import DomainRuleBroken
from kandev_es.domain.identity import Identity, Tenure
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
    and leaves alone, and why: an operator settles it (``kandev-es creations``)."""

    identity_id: uuid.UUID
    tenure: int
    workspace_id: str
    task_id: str
    phase: str
    epoch: int
    reason: str


def expired_tenures(
    app: Tasks,
    database: Database,
    projections: ProjectionRunner,
    now: datetime,
    workspace_id: uuid.UUID | None = None,
) -> list[tuple[Identity, Tenure]]:
    """Every unfinished tenure whose lease has run out (of one workspace, or
    all), as the event store has it: the read model finds them (it may lag),
    one query reads them."""
    projections.catch_up()
    where, params = "lease_expires_at < ?", [cast(Any, now.timestamp())]
    if workspace_id is not None:
        where += " AND workspace_id = ?"
        params.append(workspace_id if database.backend == "postgres" else str(workspace_id))
    with database.transaction() as tx:
        rows = tx.execute(
            f"SELECT identity_id, tenure FROM creations_view WHERE {where}"
            " ORDER BY lease_expires_at",
            params,
        )
    keys = [(uuid.UUID(str(identity)), int(number)) for identity, number in rows]
    reads = app.read_many([key for key, _ in keys]) if keys else {}
    expired: list[tuple[Identity, Tenure]] = []
    for key, number in keys:
        identity = reads.get(key)
        if not isinstance(identity, Identity):
            continue
        tenure = identity.tenures.get(number)
        if tenure is not None and tenure.in_flight and tenure.lease_expires_at < now:
            expired.append((identity, tenure))
    return expired


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

    Bounded: one creation is taken over at most ``attempts`` times per series
    (``Tenure.takeovers``; an operator's retry starts a new series), each
    takeover after the lease plus ``backoff_seconds(takeovers)``. The last
    takeover of a creation still preparing does not run its steps again: it
    aborts it (Aborting ``recovery_attempts_exhausted``), compensates and frees
    the identity. One that is still unfinished after its last takeover
    (compensation or completion could not be done) is parked: never taken over
    again, its reason recorded (``Identity.Parked``), logged at ERROR, counted
    (``kandev_runtime_recoveries_total{result="parked"}``) and listed by
    ``parked()``. A failure while recovering one creation is logged and the
    scan goes on with the next.

    An outage spends no attempt: a takeover whose work stopped because the
    store could not be reached keeps its epoch, and the next scan resumes it
    at that epoch (no new takeover) once the store is back."""

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
        # Takeovers an outage interrupted: (identity, tenure) -> (epoch, resumes).
        self._interrupted: dict[tuple[uuid.UUID, int], tuple[int, int]] = {}
        self._reported: set[tuple[uuid.UUID, int, int]] = set()  # parked, logged once

    def _due(self, tenure: Tenure, now: datetime) -> bool:
        """Taken over fewer times than allowed, and its lease and backoff have run out."""
        wait = timedelta(seconds=backoff_seconds(tenure.takeovers, self._backoff))
        fresh = tenure.parked_reason is None and tenure.takeovers < self._attempts
        return fresh and tenure.lease_expires_at + wait < now

    def _expired(self, now: datetime) -> list[tuple[Identity, Tenure]]:
        return expired_tenures(self._app, self._database, self._projections, now)

    def expired_candidates(self, now: datetime) -> list[tuple[uuid.UUID, int]]:
        return [(i.id, t.number) for i, t in self._expired(now) if self._due(t, now)]

    def parked(self) -> list[Parked]:
        """Unfinished creations taken over ``attempts`` times: left to an operator."""
        now = datetime.now(UTC)
        return [
            Parked(
                identity.id,
                tenure.number,
                str(identity.workspace_id),
                str(tenure.task_id),
                tenure.phase,
                tenure.epoch,
                tenure.parked_reason or ABANDONED_REASON,
            )
            for identity, tenure in self._expired(now)
            if tenure.parked(self._attempts, now)
        ]

    def recover_once(self) -> list[Recovery]:
        """One scan: takeovers an outage interrupted are resumed first, then
        every expired tenure this runtime wins is driven to the end. One
        creation's failure never stops the others: it is logged (and, at its
        last takeover, parked) and the scan goes on. Only a store outage ends
        the scan early (every other creation would meet it too)."""
        done = self._resume_interrupted()
        now = datetime.now(UTC)
        for identity, tenure in self._expired(now):
            if tenure.parked(self._attempts, now):
                self._report_parked(identity.id, tenure, None)
                continue
            if not self._due(tenure, now):
                continue
            try:
                recovery = self._take_over(identity.id, tenure.number, now)
            except StoreUnavailable:
                raise
            except Exception as error:
                self._failed(identity.id, tenure.number, error)
                continue
            if recovery is not None:
                done.append(recovery)
        return done

    def _resume_interrupted(self) -> list[Recovery]:
        """Act again, at the same epoch, on the takeovers an outage stopped:
        the epoch is still this runtime's unless someone took over since
        (then it is fenced). Each is resumed at most MAX_RESUMES times; after
        that the lease decides, as for any takeover (a bound on the events)."""
        done = []
        for (identity_id, number), (epoch, resumes) in list(self._interrupted.items()):
            identity = self._app.load(identity_id, Identity)  # still away: kept, raised
            del self._interrupted[(identity_id, number)]
            tenure = identity.tenures.get(number) if identity is not None else None
            if tenure is None or (tenure.epoch, tenure.owner_id) != (epoch, self.owner_id):
                continue  # settled, taken over by another, or never ours (a lost save)
            if not tenure.in_flight or resumes >= MAX_RESUMES:
                continue
            try:
                last = tenure.takeovers >= self._attempts
                with self._for_claimant(tenure, identity_id):
                    recovery = self._act(identity_id, number, epoch, resumes + 1, last)
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
        parked = tenure is not None and tenure.in_flight and tenure.takeovers >= self._attempts
        if parked and identity is not None and tenure is not None:
            self._park(identity, tenure, error)
            return
        takeovers = tenure.takeovers if tenure is not None else 0
        metrics.record_recovery("failed")
        log.warning(
            "recovering identity=%s tenure=%s failed at takeover %s of %s: %r;"
            " retried after %.0f s",
            identity_id, number, takeovers, self._attempts, error,
            self._lease.total_seconds() + backoff_seconds(takeovers, self._backoff),
        )

    def _park(self, identity: Identity, tenure: Tenure, error: Exception) -> None:
        """Record why the series ended (best effort: the log says it anyway)."""
        reason = f"{type(error).__name__}: {error}"[:1000]
        try:
            identity.park(tenure.number, reason)
            self._app.save_atomically(identity)
        except (VersionConflict, DomainRuleBroken, StoreUnavailable):
            pass  # someone else wrote first, or the store is away: logged below
        self._report_parked(identity.id, tenure, reason)

    def _report_parked(self, identity_id: uuid.UUID, tenure: Tenure, reason: str | None) -> None:
        """Whatever parks a creation -- a failed last takeover, or a runtime
        gone after taking it over for the last time -- is logged at ERROR and
        counted, once per series in this process."""
        key = (identity_id, tenure.number, tenure.epoch)
        if key in self._reported:
            return
        self._reported.add(key)
        metrics.record_recovery(PARKED)
        log.error(
            "creation parked after %s takeovers: identity=%s tenure=%s phase=%s: %s;"
            " the Runtime leaves it to an operator (kandev-es creations parked)",
            tenure.takeovers, identity_id, tenure.number, tenure.phase,
            reason or tenure.parked_reason or ABANDONED_REASON,
        )

    def _take_over(self, identity_id: uuid.UUID, number: int, now: datetime) -> Recovery | None:
        identity = self._app.load(identity_id, Identity)
        if identity is None:
            return None
        tenure = identity.tenure(number)
        # The read model may lag: the event store decides.
        if not tenure.in_flight or not self._due(tenure, now):
            return None
        try:
            steps_for(tenure.plan)
        except UnknownStep:
            # Planned by a newer version: left, untouched, for a runtime that knows it.
            return None
        with self._for_claimant(tenure, identity_id):
            return self._recover(identity, number, now)

    @staticmethod
    @contextlib.contextmanager
    def _for_claimant(tenure: Tenure, identity_id: uuid.UUID) -> Iterator[None]:
        """Work done for the request that claimed the tenure (unless a request
        of its own asked for it): its log lines carry that request's id, its
        trace (``recover``) links to that request's trace."""
        acting_for = serving.current_request_id() or tenure.request_id
        with serving.acting_for(acting_for), tracing.linked(
            "recover", tenure.traceparent, **{"kandev.identity": str(identity_id)}
        ):
            yield

    def _recover(self, identity: Identity, number: int, now: datetime) -> Recovery | None:
        identity_id = identity.id
        try:
            epoch = identity.recover(
                number, self.owner_id, now + self._lease, serving.current_request_id()
            )
            self._app.save_atomically(identity)
        except (VersionConflict, DomainRuleBroken):
            return None  # another runtime, or the owner, got there first
        except StoreUnavailable:
            # Saved or not, nobody can tell now: resumed if it was (see there).
            self._interrupted[(identity_id, number)] = (identity.tenure(number).epoch, 0)
            raise
        log.info("recovering identity=%s tenure=%s epoch=%s", identity_id, number, epoch)
        last = identity.tenure(number).takeovers >= self._attempts
        return self._act(identity_id, number, epoch, 0, last)

    def _act(
        self, identity_id: uuid.UUID, number: int, epoch: int, resumes: int, last: bool
    ) -> Recovery | None:
        """Drive a tenure taken over at ``epoch`` to its end; the ``last``
        takeover of its series gives a creation still preparing up instead."""
        try:
            if last:
                outcome = self._driver.abandon(identity_id, number, epoch, ABANDONED_REASON)
            else:
                outcome = self._driver.drive(identity_id, number, epoch)
        except Fenced:
            metrics.record_recovery("fenced")
            return None  # a later runtime took over from us in turn
        except StoreUnavailable:
            self._interrupted[(identity_id, number)] = (epoch, resumes)
            log.warning(
                "recovering identity=%s tenure=%s epoch=%s stopped by a store outage;"
                " resumed at the same epoch once the store is back", identity_id, number, epoch,
            )
            raise
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
