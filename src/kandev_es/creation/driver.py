"""Drives one tenure's creation to Completed or Aborted from its durable
manifest. The creating request (epoch 0) and the recovering Runtime (a later
epoch) run this same code; a write at a stale epoch is refused (fencing)."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kandev_es import metrics
from kandev_es.application import Tasks, VersionConflict
from kandev_es.config import Settings
from kandev_es.creation import failpoints
from kandev_es.creation.lease import Lease, LeaseLost
from kandev_es.creation.steps.base import (
    COMPENSATED,
    FAILED,
    STARTED,
    SUCCEEDED,
    UNKNOWN,
    RunCredentials,
    Step,
    StepContext,
    StepFailed,
    remove_effect,
)
from kandev_es.creation.steps.registry import steps_for
from kandev_es.domain import creation
from kandev_es.domain.identity import (
    ABORTED,
    ABORTING,
    COMPLETED,
    COMPLETING,
    PREPARING,
    PROOF_MISSING,
    Identity,
    Tenure,
)
from kandev_es.domain.task import Task
from kandev_es.domain.workspace import Workspace
from kandev_es.errors import (
    EffectUnproven,
    InternalError,
    KandevError,
    StoreUnavailable,
    Unavailable,
    WorkspaceDeleted,
)
from kandev_es.observability import tracing

log = logging.getLogger("kandev_es.creation")
MAX_PASSES = 50
# How often the Runtime resumes one takeover that store outages stopped
# before it counts as spent (a store that keeps coming and going).
MAX_RESUMES = 20


def event_bound(
    steps: int, step_attempts: int, recovery_attempts: int, resumes: int = MAX_RESUMES
) -> int:
    """The most events one tenure can add to its identity's stream in one
    series of takeovers, with ``steps`` steps, KANDEV_STEP_ATTEMPTS,
    KANDEV_RECOVERY_ATTEMPTS and ``resumes`` (MAX_RESUMES).

    A pass over the steps records at most 3 per step (started, unknown,
    succeeded) and 2 more (a missing proof, or failed + Aborting, or
    Completing). Passes that record something: at most step_attempts - 1 that
    end at a missing proof, one that ends in Aborting or Completing, one cut
    short by an error in each of the 1 + recovery_attempts drives and in each
    of their resumes after a store outage, and 2 that a concurrent release or
    workspace deletion can interrupt. Besides: Claimed, one RecoveryClaimed per
    takeover, at most one compensated per step plus Aborted, Completed,
    Parked, and the 2 operator events (Released, deletion). An operator's
    retry or abort starts anew from here. Not counted: the owner's lease
    renewals (``LeaseRenewed``, creation/lease.py), one per third of a lease
    that a step runs -- a live owner's step may run for hours."""
    drives = (1 + recovery_attempts) * (1 + resumes)
    passes = (step_attempts - 1) + 1 + drives + 2
    return 1 + recovery_attempts + passes * (3 * steps + 2) + (steps + 1) + 1 + 1 + 2


class Fenced(InternalError):
    """A newer epoch owns this tenure; the stale owner stops without acting."""


@dataclass(frozen=True)
class DriveOutcome:
    identity: Identity
    task: Task
    tenure: Tenure
    error: KandevError | None = None


class CreationDriver:
    def __init__(self, app: Tasks, settings: Settings, credentials: RunCredentials) -> None:
        self._app = app
        self._settings = settings
        self._credentials = credentials
        self._lease = timedelta(seconds=settings.lease_seconds)

    def drive(self, identity_id: uuid.UUID, number: int, epoch: int) -> DriveOutcome:
        error: KandevError | None = None
        lease = Lease(self._app, identity_id, number, epoch, self._settings.lease_seconds)
        for _ in range(MAX_PASSES):
            identity, task = self._load(identity_id, number)
            tenure = identity.tenure(number)
            if tenure.epoch != epoch:
                raise Fenced(f"tenure {number} is now at epoch {tenure.epoch}")
            if tenure.phase in (COMPLETED, ABORTED):
                return DriveOutcome(identity, task, tenure, error)
            ctx = StepContext(
                self._app,
                self._settings,
                identity_id,
                number,
                task.id,
                tenure.plan,
                self._credentials,
                lease,
            )
            try:
                if tenure.phase == COMPLETING:
                    self._complete(identity, task, number)
                elif tenure.phase == ABORTING:
                    self._compensate(identity, task, tenure, ctx)
                else:
                    error = self._prepare(identity, task, tenure, ctx) or error
            except VersionConflict:
                continue  # someone else wrote: re-read, re-check the epoch
            settled = identity.tenure(number)
            if settled.phase in (COMPLETED, ABORTED):
                # What we just saved is the current state: no need to read it back.
                return DriveOutcome(identity, task, settled, error)
        raise Unavailable("creation did not settle; the runtime will finish it")

    def _load(self, identity_id: uuid.UUID, number: int) -> tuple[Identity, Task]:
        identity = self._app.load(identity_id, Identity)
        assert identity is not None
        task = self._app.load(identity.tenure(number).task_id, Task)
        assert task is not None
        return identity, task

    def _record(
        self, identity: Identity, number: int, step: str, status: str, evidence: dict[str, Any]
    ) -> None:
        identity.record_step(
            number,
            step,
            f"{identity.tenure(number).task_id}:{step}",
            status,
            evidence,
            lease_expires_at=datetime.now(UTC) + self._lease,
        )
        self._app.save_atomically(identity)
        metrics.record_step(step, status)
        tracing.note(**{"kandev.step.outcome": status})

    def _prepare(
        self, identity: Identity, task: Task, tenure: Tenure, ctx: StepContext
    ) -> KandevError | None:
        number = tenure.number
        workspace = self._app.read(ctx.workspace_id, Workspace)
        if workspace is None or workspace.deleted:
            # Never complete into a deleted workspace: abort and compensate.
            identity.begin_aborting(number, "workspace_deleted")
            self._app.save_atomically(identity)
            return WorkspaceDeleted()
        steps = steps_for(tenure.plan)  # the steps it was claimed with
        for step in steps:
            status = tenure.steps.get(step.name, {}).get("status")
            if status == SUCCEEDED:
                continue
            with tracing.span(f"step {step.name}", **{"kandev.step": step.name}):
                if status in (STARTED, UNKNOWN, FAILED):
                    evidence = step.reconcile(ctx)
                    if evidence is not None:
                        self._record(identity, number, step.name, SUCCEEDED, evidence)
                        continue
                failure = self._run_step(identity, number, step, ctx)
            if failure is not None:
                return failure
        # Proof gates Completing: every effect must be present in the world now.
        for step in steps:
            if step.reconcile(ctx) is None:
                runs = identity.tenure(number).missing_proofs + 1
                if runs >= self._settings.step_attempts:
                    # Made again and again, never proven: give up (bounded).
                    unproven = EffectUnproven(
                        f"step {step.name} was run {runs} times and its effect was never"
                        " proven; the creation was aborted",
                        step=step.name,
                        attempts=runs,
                    )
                    self._abort(identity, number, step.name, unproven)
                    return unproven
                self._record(identity, number, step.name, UNKNOWN, dict(PROOF_MISSING))
                return None  # the next pass re-runs it
        failpoints.hit(self._settings, "completing:before")
        identity.begin_completing(number)
        if not steps:
            # Nothing to prove and nothing that could fail: Completing and
            # Completed go in one transaction (one commit fewer per create).
            self._complete(identity, task, number)
            return None
        self._app.save_atomically(identity)
        failpoints.hit(self._settings, "completing:after")
        return None

    def _run_step(
        self, identity: Identity, number: int, step: Step, ctx: StepContext
    ) -> KandevError | None:
        started = time.monotonic()
        self._record(identity, number, step.name, STARTED, {})  # fenced before any effect
        assert ctx.lease is not None
        ctx.lease.held_from(started)
        evidence, raised = self._effect(identity, step, ctx)
        self._still_held(ctx, step)
        if isinstance(raised, StepFailed):
            self._abort(identity, number, step.name, raised.error, raised.detail)
            return raised.error
        if isinstance(raised, StoreUnavailable):
            # Reconciling would need the same database: stop here, answer 503;
            # the step stays `started` and the Runtime reconciles it later.
            raise raised
        if raised is not None:  # the effect's result is unknown: ask the world
            log.error("step %s raised; reconciling", step.name, exc_info=raised)
            self._record(identity, number, step.name, UNKNOWN, {"error": repr(raised)})
            failpoints.hit(self._settings, f"{step.name.split(':', 1)[0]}:unknown")
            found = step.reconcile(ctx)
            if found is None:
                unproven = EffectUnproven(f"step {step.name} failed and its effect is absent")
                self._abort(identity, number, step.name, unproven, repr(raised))
                return unproven
            evidence = found
        assert evidence is not None
        self._record(identity, number, step.name, SUCCEEDED, evidence)
        return None

    def _effect(
        self, identity: Identity, step: Step, ctx: StepContext
    ) -> tuple[dict[str, Any] | None, Exception | None]:
        """Run the step with its lease renewed meanwhile (creation/lease.py):
        its evidence, or what it raised. The failpoints either side of the
        effect are part of it: one that raises is the step raising before or
        after its effect was made. Then, still renewing, whether the lease is
        held: an owner paused past its lease learns here that it lost it."""
        assert ctx.lease is not None
        kind = step.name.split(":", 1)[0]
        evidence: dict[str, Any] | None = None
        raised: Exception | None = None
        with ctx.lease.renewing(identity):
            try:
                failpoints.hit(self._settings, f"{kind}:before")
                evidence = step.run(ctx)
                failpoints.hit(self._settings, f"{kind}:after")
            except Exception as error:
                raised = error
            try:
                ctx.lease.check()
            except LeaseLost:
                pass  # ``lost`` is set: _still_held acts on it
            except Exception as error:  # the store is away: nothing can be recorded
                raised = raised if isinstance(raised, StoreUnavailable) else error
        return evidence, raised

    def _still_held(self, ctx: StepContext, step: Step) -> None:
        """After a step: ``Fenced`` if its lease was lost meanwhile (after
        removing an effect the new owner no longer wants), a re-read if a
        renewal left our Identity behind the store."""
        assert ctx.lease is not None
        if ctx.lease.lost.is_set():
            self._after_losing(ctx, step)
            raise Fenced(f"tenure {ctx.tenure} lost its lease at epoch {ctx.lease.epoch}")
        if ctx.lease.stale:
            raise VersionConflict("the lease's renewal left this identity behind")

    def _after_losing(self, ctx: StepContext, step: Step) -> None:
        """This owner's step ran on after a newer owner took the tenure over.
        Whatever it made exists before the read below. A newer owner still
        preparing or completing then finds it (its reconcile, or its
        compensation should it abort later: that starts after this read); one
        already aborting or aborted may have looked before it existed, so it
        is removed here. Only an owner killed between its late effect and this
        removal leaves one behind (docs/architecture.md)."""
        identity = self._app.load(ctx.identity_id, Identity)
        tenure = None if identity is None else identity.tenures.get(ctx.tenure)
        if tenure is None or tenure.phase not in (ABORTING, ABORTED) or step.absent(ctx):
            return
        try:
            step.compensate(ctx)
        except Exception:  # logged with the step: an operator removes what is left
            log.exception("removing step %s's late effect failed", step.name)
            return
        log.warning(
            "step %s finished after its lease was lost to epoch %s (%s): its effect was removed",
            step.name,
            tenure.epoch,
            tenure.phase,
        )

    def abandon(self, identity_id: uuid.UUID, number: int, epoch: int, reason: str) -> DriveOutcome:
        """Stop preparing: abort the tenure (``reason`` is the Aborting's) at
        ``epoch``, then drive it, which compensates every step and records
        Aborted. A tenure already completing or aborting is only driven."""
        identity, _ = self._load(identity_id, number)
        tenure = identity.tenure(number)
        if tenure.epoch != epoch:
            raise Fenced(f"tenure {number} is now at epoch {tenure.epoch}")
        if tenure.phase == PREPARING:
            identity.begin_aborting(number, reason)
            self._app.save_atomically(identity)
        return self.drive(identity_id, number, epoch)

    def abort_forcibly(self, identity_id: uuid.UUID, number: int, epoch: int) -> DriveOutcome:
        """An operator's abort (runtime/settle.py), at the ``epoch`` its
        AbortForced took: every step that began is removed in reverse order --
        forcibly where its compensation fails -- each recorded compensated with
        its evidence, then Aborted. Raises ``CompensationUnproven`` (the
        creation stays aborting) while an effect cannot be removed."""
        identity, task = self._load(identity_id, number)
        tenure = identity.tenure(number)
        if tenure.epoch != epoch:
            raise Fenced(f"tenure {number} is now at epoch {tenure.epoch}")
        if tenure.phase == ABORTED:
            return DriveOutcome(identity, task, tenure)
        ctx = StepContext(
            self._app, self._settings, identity_id, number, task.id, tenure.plan, self._credentials
        )
        for step in reversed(steps_for(tenure.plan)):
            status = tenure.steps.get(step.name, {}).get("status")
            if status is None or status == COMPENSATED:
                continue
            self._record(identity, number, step.name, COMPENSATED, remove_effect(step, ctx))
        identity.abort(number)
        task.abort_creation()
        self._app.save_atomically(identity, task)
        log.info("aborted by an operator: identity=%s tenure=%s", identity.id, number)
        return DriveOutcome(identity, task, identity.tenure(number))

    def _abort(
        self,
        identity: Identity,
        number: int,
        step: str,
        error: KandevError,
        detail: str | None = None,
    ) -> None:
        evidence = error.to_dict() if detail is None else {**error.to_dict(), "detail": detail}
        key = f"{identity.tenure(number).task_id}:{step}"
        identity.record_step(number, step, key, FAILED, evidence)
        identity.begin_aborting(number, error.code)
        self._app.save_atomically(identity)
        metrics.record_step(step, FAILED)
        tracing.note(**{"kandev.step.outcome": FAILED, "kandev.error": error.code})

    def _complete(self, identity: Identity, task: Task, number: int) -> None:
        outcome = creation.complete(identity, task, number)
        self._app.save_atomically(identity, task)
        log.info("completed identity=%s tenure=%s outcome=%s", identity.id, number, outcome)

    def _compensate(self, identity: Identity, task: Task, tenure: Tenure, ctx: StepContext) -> None:
        for step in reversed(steps_for(tenure.plan)):
            status = tenure.steps.get(step.name, {}).get("status")
            if status is None or status == COMPENSATED:
                continue
            assert ctx.lease is not None
            with ctx.lease.renewing(identity):
                step.compensate(ctx)
                gone = step.absent(ctx)
            if ctx.lease.lost.is_set():
                raise Fenced(f"tenure {tenure.number} lost its lease while compensating")
            if ctx.lease.stale:
                raise VersionConflict("the lease's renewal left this identity behind")
            if not gone:
                raise Unavailable(f"compensation of {step.name} is not yet proven")
            self._record(identity, tenure.number, step.name, COMPENSATED, {"proof": "absent"})
        identity.abort(tenure.number)
        task.abort_creation()
        self._app.save_atomically(identity, task)
        log.info("aborted identity=%s tenure=%s", identity.id, tenure.number)
