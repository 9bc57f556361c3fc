"""The Identity aggregate: one stream per (workspace, external ID).

The stream is the identity's whole history across holders. Each Claimed opens a
new tenure; every later event names its tenure, because after a release a new
tenure may start while the released one is still finishing (AC-7).
Guards live in the command methods, never in ``apply``: old events must always
replay even when the rules tighten.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from eventsourcing.domain import Aggregate

from kandev_es.domain.errors import DomainRuleBroken
from kandev_es.domain.events import DirectEvents, DirectInit

PREPARING = "preparing"
COMPLETING = "completing"
COMPLETED = "completed"
ABORTING = "aborting"
ABORTED = "aborted"

# The evidence of a step found unproven at the proof gate (recorded "unknown").
PROOF_MISSING: dict[str, Any] = {"proof": "missing"}

# The plan's free text, forgotten with its task (docs/auditing.md: Erasure).
FORGETTABLE_PLAN_FIELDS = ("title", "description")

OUTCOME_CREATED = "created"
OUTCOME_CREATED_IDENTITY_LOST = "created_identity_lost"


@dataclass
class Tenure:
    number: int
    task_id: uuid.UUID
    owner_id: str
    actor: str
    plan: dict[str, Any]
    plan_hash: str
    lease_expires_at: datetime
    handle_hash: str = ""
    epoch: int = 0
    abort_reason: str | None = None
    phase: str = PREPARING
    released: bool = False
    release_operation_id: str | None = None
    released_by: str | None = None
    deletion_generation: int | None = None
    outcome: str | None = None
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The request that claimed this tenure (its X-Request-Id) and, when traces
    # were on, its span (W3C traceparent): the Runtime's work on the tenure
    # carries that id and links to that trace.
    request_id: str | None = None
    traceparent: str | None = None
    # Takeovers by the recovery Runtime in the current series: the bound
    # (KANDEV_RECOVERY_ATTEMPTS) counts these; an operator's retry starts a
    # new series. The epoch, the fencing token, only ever grows.
    takeovers: int = 0
    # Why the Runtime stopped taking it over (its last takeover's failure).
    parked_reason: str | None = None
    # The operator's last retry or abort of it (operation id).
    settle_operation_id: str | None = None
    # How often a proof was found missing before Completing (each one means
    # the step runs again): derived from the StepRecorded events, bounded by
    # the driver (KANDEV_STEP_ATTEMPTS).
    missing_proofs: int = 0

    @property
    def holds(self) -> bool:
        return not self.released and self.phase != ABORTED

    @property
    def settled(self) -> bool:
        return self.phase == COMPLETED

    @property
    def in_flight(self) -> bool:
        return self.phase in (PREPARING, COMPLETING, ABORTING)

    def parked(self, attempts: int, now: datetime) -> bool:
        """Left to an operator: unfinished, its last lease run out, and given
        up by the Runtime (Parked recorded) or taken over ``attempts`` times
        in its series (KANDEV_RECOVERY_ATTEMPTS)."""
        given_up = self.parked_reason is not None or self.takeovers >= attempts
        return self.in_flight and given_up and self.lease_expires_at < now


class Identity(DirectEvents, Aggregate):
    class Registered(DirectInit, Aggregate.Created):
        workspace_id: uuid.UUID
        external_id: str | None

    def __init__(self, workspace_id: uuid.UUID, external_id: str | None) -> None:
        self.workspace_id = workspace_id
        self.external_id = external_id
        self.tenures: dict[int, Tenure] = {}

    @classmethod
    def register(
        cls, identity_id: uuid.UUID, workspace_id: uuid.UUID, external_id: str | None
    ) -> Identity:
        return cls._create(
            cls.Registered, id=identity_id, workspace_id=workspace_id, external_id=external_id
        )

    # ----- queries -----------------------------------------------------------
    @property
    def holder(self) -> Tenure | None:
        for number in sorted(self.tenures, reverse=True):
            tenure = self.tenures[number]
            if tenure.holds:
                return tenure
        return None

    def tenure(self, number: int) -> Tenure:
        try:
            return self.tenures[number]
        except KeyError:
            raise DomainRuleBroken(f"identity has no tenure {number}") from None

    # ----- commands ----------------------------------------------------------
    def claim(
        self,
        *,
        task_id: uuid.UUID,
        owner_id: str,
        actor: str,
        plan: dict[str, Any],
        plan_hash: str,
        lease_expires_at: datetime,
        handle_hash: str = "",
        request_id: str | None = None,
        traceparent: str | None = None,
    ) -> Tenure:
        if self.holder is not None:
            raise DomainRuleBroken("identity is already held")
        number = max(self.tenures, default=0) + 1
        self.trigger_event(
            self.Claimed,
            tenure=number,
            task_id=task_id,
            owner_id=owner_id,
            actor=actor,
            plan=plan,
            plan_hash=plan_hash,
            lease_expires_at=lease_expires_at,
            handle_hash=handle_hash,
            request_id=request_id,
            traceparent=traceparent,
        )
        return self.tenures[number]

    def record_step(
        self,
        tenure: int,
        step: str,
        key: str,
        status: str,
        evidence: dict[str, Any],
        lease_expires_at: datetime | None = None,
    ) -> None:
        if self.tenure(tenure).phase not in (PREPARING, ABORTING):
            raise DomainRuleBroken("steps are recorded only while preparing or aborting")
        self.trigger_event(
            self.StepRecorded,
            tenure=tenure,
            step=step,
            key=key,
            status=status,
            evidence=evidence,
            lease_expires_at=lease_expires_at,
        )

    def begin_aborting(self, tenure: int, reason: str) -> None:
        if self.tenure(tenure).phase != PREPARING:
            # Once Completing is recorded only Complete is allowed (AC-5).
            raise DomainRuleBroken("only a preparing creation can abort")
        self.trigger_event(self.Aborting, tenure=tenure, reason=reason)

    def abort(self, tenure: int) -> None:
        if self.tenure(tenure).phase != ABORTING:
            raise DomainRuleBroken("abort needs an aborting creation")
        self.trigger_event(self.Aborted, tenure=tenure)

    def recover(
        self,
        tenure: int,
        owner_id: str,
        lease_expires_at: datetime,
        request_id: str | None = None,
    ) -> int:
        """The Runtime takes over an expired tenure; the new epoch fences the
        old owner. ``request_id``: the request the takeover was done for."""
        current = self.tenure(tenure)
        if not current.in_flight:
            raise DomainRuleBroken("only an unfinished creation can be recovered")
        epoch = current.epoch + 1
        self.trigger_event(
            self.RecoveryClaimed,
            tenure=tenure,
            epoch=epoch,
            owner_id=owner_id,
            lease_expires_at=lease_expires_at,
            request_id=request_id,
        )
        return epoch

    def renew_lease(self, tenure: int, epoch: int, lease_expires_at: datetime) -> None:
        """The owner at ``epoch`` still works on the tenure (a step is running):
        its lease now runs until ``lease_expires_at``. Refused once another
        epoch owns it or it has ended: the renewal is fenced like every write."""
        current = self.tenure(tenure)
        if current.epoch != epoch or not current.in_flight:
            raise DomainRuleBroken(f"tenure {tenure} is no longer held at epoch {epoch}")
        self.trigger_event(
            self.LeaseRenewed, tenure=tenure, epoch=epoch, lease_expires_at=lease_expires_at
        )

    def park(self, tenure: int, reason: str) -> None:
        """The Runtime's last takeover of the series failed: it leaves the
        creation to an operator, saying why."""
        if not self.tenure(tenure).in_flight:
            raise DomainRuleBroken("only an unfinished creation can be parked")
        self.trigger_event(self.Parked, tenure=tenure, reason=reason)

    def renew_recovery(
        self, tenure: int, operation_id: str, *, actor: str, request_id: str | None = None
    ) -> int:
        """An operator's retry of a parked creation (after a repair): a fresh
        series of takeovers. Returns the new epoch."""
        if not self.tenure(tenure).in_flight:
            raise DomainRuleBroken("only an unfinished creation can be retried")
        return self._settling(self.RecoveryRenewed, tenure, operation_id, actor, request_id)

    def force_abort(
        self, tenure: int, operation_id: str, *, actor: str, request_id: str | None = None
    ) -> int:
        """An operator's abort of a parked creation: from here its effects are
        removed, forcibly if need be, and it ends Aborted. Never once it is
        completing (AC-5: only Complete is allowed then). Returns the epoch
        the operator's compensation acts at."""
        phase = self.tenure(tenure).phase
        if phase not in (PREPARING, ABORTING):
            raise DomainRuleBroken(f"a {phase} creation cannot be aborted")
        return self._settling(self.AbortForced, tenure, operation_id, actor, request_id)

    def _settling(
        self, kind: type[Any], tenure: int, operation_id: str, actor: str,
        request_id: str | None,
    ) -> int:
        """``request_id``: the operator's request (its X-Request-Id), if any."""
        epoch = self.tenure(tenure).epoch + 1
        self.trigger_event(
            kind, tenure=tenure, epoch=epoch, operation_id=operation_id, actor=actor,
            owner_id=f"operator:{operation_id}", request_id=request_id,
        )
        return epoch

    def begin_completing(self, tenure: int) -> None:
        if self.tenure(tenure).phase != PREPARING:
            raise DomainRuleBroken("only a preparing creation can begin completing")
        self.trigger_event(self.Completing, tenure=tenure)

    def complete(self, tenure: int) -> str:
        current = self.tenure(tenure)
        # A plan without steps has nothing to prove: it completes from preparing.
        without_steps = current.phase == PREPARING and not current.plan.get("steps")
        if current.phase != COMPLETING and not without_steps:
            raise DomainRuleBroken("complete needs a completing creation")
        outcome = OUTCOME_CREATED_IDENTITY_LOST if current.released else OUTCOME_CREATED
        self.trigger_event(self.Completed, tenure=tenure, outcome=outcome)
        return outcome

    def forget_task(
        self, task_id: uuid.UUID, operation_id: str, request_id: str | None = None,
        redactions: str | None = None,
    ) -> None:  # fmt: skip
        """Record that ``task_id`` was forgotten, on each tenure it held; the
        first record carries the redaction statement of this stream's events
        (``redactions``, erasure/redaction.py), so its proof bundle has it."""
        for number, tenure in sorted(self.tenures.items()):
            if tenure.task_id == task_id:
                self.trigger_event(
                    self.Forgotten, tenure=number, task_id=task_id,
                    operation_id=operation_id, request_id=request_id,
                    redactions=redactions,
                )  # fmt: skip
                redactions = None

    def release(
        self,
        tenure: int,
        operation_id: str,
        reason: str,
        deletion_generation: int | None = None,
        *,
        actor: str,
        request_id: str | None = None,
    ) -> None:
        """``actor`` names who released (a principal's ``token:<id>``, or ``cli``),
        never a secret; ``request_id`` the request that released it."""
        current = self.tenure(tenure)
        if not current.holds:
            raise DomainRuleBroken("tenure no longer holds the identity")
        if current.phase in (COMPLETING, ABORTING):
            # Phase B is in progress: release must not race it (AC-6).
            raise DomainRuleBroken(f"cannot release a {current.phase} creation")
        self.trigger_event(
            self.Released,
            tenure=tenure,
            operation_id=operation_id,
            reason=reason,
            deletion_generation=deletion_generation,
            actor=actor,
            request_id=request_id,
        )

    def record_workspace_deletion(
        self,
        tenure: int,
        operation_id: str,
        generation: int,
        *,
        actor: str,
        request_id: str | None = None,
    ) -> None:
        """Workspace deletion reaches this tenure: release it if it still holds;
        if an operator released it first (say while it was preparing), record the
        generation on its own, so every tenure the deletion took out carries it."""
        current = self.tenure(tenure)
        if current.deletion_generation is not None:
            return
        if current.holds:
            self.release(
                tenure, operation_id, "workspace_deleted", generation,
                actor=actor, request_id=request_id,
            )
            return
        self.trigger_event(
            self.WorkspaceDeletionRecorded,
            tenure=tenure,
            operation_id=operation_id,
            generation=generation,
        )

    # ----- events ------------------------------------------------------------
    class Claimed(Aggregate.Event):
        tenure: int
        task_id: uuid.UUID
        owner_id: str
        actor: str
        plan: dict[str, Any]
        plan_hash: str
        lease_expires_at: datetime
        # Defaulted so streams recorded before creation handles (and before
        # request ids and traces) still replay.
        handle_hash: str = ""
        request_id: str | None = None
        traceparent: str | None = None

        def apply(self, aggregate: Identity) -> None:
            aggregate.tenures[self.tenure] = Tenure(
                number=self.tenure,
                task_id=self.task_id,
                owner_id=self.owner_id,
                actor=self.actor,
                plan=self.plan,
                plan_hash=self.plan_hash,
                lease_expires_at=self.lease_expires_at,
                handle_hash=self.handle_hash,
                request_id=self.request_id,
                traceparent=self.traceparent,
            )

    class StepRecorded(Aggregate.Event):
        tenure: int
        step: str
        key: str
        status: str
        evidence: dict[str, Any]
        lease_expires_at: datetime | None = None

        def apply(self, aggregate: Identity) -> None:
            tenure = aggregate.tenures[self.tenure]
            tenure.steps[self.step] = {
                "key": self.key,
                "status": self.status,
                "evidence": self.evidence,
            }
            if self.lease_expires_at is not None:
                tenure.lease_expires_at = self.lease_expires_at
            if self.status == "unknown" and self.evidence == PROOF_MISSING:
                tenure.missing_proofs += 1

    class Aborting(Aggregate.Event):
        tenure: int
        reason: str

        def apply(self, aggregate: Identity) -> None:
            tenure = aggregate.tenures[self.tenure]
            tenure.phase = ABORTING
            tenure.abort_reason = self.reason

    class Aborted(Aggregate.Event):
        tenure: int

        def apply(self, aggregate: Identity) -> None:
            aggregate.tenures[self.tenure].phase = ABORTED

    class RecoveryClaimed(Aggregate.Event):
        tenure: int
        epoch: int
        owner_id: str
        lease_expires_at: datetime
        # Defaulted so takeovers recorded before request ids still replay.
        request_id: str | None = None

        def apply(self, aggregate: Identity) -> None:
            tenure = aggregate.tenures[self.tenure]
            tenure.epoch = self.epoch
            tenure.owner_id = self.owner_id
            tenure.lease_expires_at = self.lease_expires_at
            tenure.takeovers += 1

    class LeaseRenewed(Aggregate.Event):
        """A heartbeat: the owner at ``epoch`` renewed its lease while a step ran."""

        tenure: int
        epoch: int
        lease_expires_at: datetime

        def apply(self, aggregate: Identity) -> None:
            aggregate.tenures[self.tenure].lease_expires_at = self.lease_expires_at

    class OperatorSettling(Aggregate.Event):
        """An operator takes a parked tenure in hand: a new epoch fences
        whoever still acts on it (the two kinds below)."""

        tenure: int
        epoch: int
        operation_id: str
        actor: str
        owner_id: str
        # The operator's request (its X-Request-Id), if any; defaulted so
        # events stored before it replay.
        request_id: str | None = None

        def apply(self, aggregate: Identity) -> None:
            tenure = aggregate.tenures[self.tenure]
            tenure.epoch = self.epoch
            tenure.owner_id = self.owner_id
            tenure.settle_operation_id = self.operation_id
            self.settle(tenure)

        def settle(self, tenure: Tenure) -> None:
            raise NotImplementedError

    class RecoveryRenewed(OperatorSettling):
        def settle(self, tenure: Tenure) -> None:
            tenure.takeovers = 0
            tenure.parked_reason = None

    class AbortForced(OperatorSettling):
        def settle(self, tenure: Tenure) -> None:
            if tenure.phase == PREPARING:
                tenure.abort_reason = "operator_abort"
            tenure.phase = ABORTING

    class Parked(Aggregate.Event):
        tenure: int
        reason: str

        def apply(self, aggregate: Identity) -> None:
            aggregate.tenures[self.tenure].parked_reason = self.reason

    class Completing(Aggregate.Event):
        tenure: int

        def apply(self, aggregate: Identity) -> None:
            aggregate.tenures[self.tenure].phase = COMPLETING

    class Completed(Aggregate.Event):
        tenure: int
        outcome: str

        def apply(self, aggregate: Identity) -> None:
            tenure = aggregate.tenures[self.tenure]
            tenure.phase = COMPLETED
            tenure.outcome = self.outcome

    class Released(Aggregate.Event):
        tenure: int
        operation_id: str
        reason: str
        deletion_generation: int | None
        # Who released. Defaulted so events stored before it existed replay
        # (an auditor sees "unknown"); the same for the releasing request.
        actor: str | None = None
        request_id: str | None = None

        def apply(self, aggregate: Identity) -> None:
            tenure = aggregate.tenures[self.tenure]
            tenure.released = True
            tenure.release_operation_id = self.operation_id
            tenure.released_by = self.actor
            if self.deletion_generation is not None:
                tenure.deletion_generation = self.deletion_generation

    class Forgotten(Aggregate.Event):
        """The task of a tenure was forgotten (erasure/): its plan's free text
        is gone from the aggregate, as from every read of its sealed Claimed."""

        tenure: int
        task_id: uuid.UUID
        operation_id: str
        request_id: str | None = None
        redactions: str | None = None  # the same statement as Task.Forgotten's

        def apply(self, aggregate: Identity) -> None:
            tenure = aggregate.tenures[self.tenure]
            tenure.plan = {**tenure.plan, **dict.fromkeys(FORGETTABLE_PLAN_FIELDS)}

    class WorkspaceDeletionRecorded(Aggregate.Event):
        tenure: int
        operation_id: str
        generation: int

        def apply(self, aggregate: Identity) -> None:
            aggregate.tenures[self.tenure].deletion_generation = self.generation
