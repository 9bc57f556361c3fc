"""The create protocol. Every entry point — REST, MCP, Office
runtime, agentctl — calls ``CreationService.create``; there is no other path."""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kandev_es import metrics
from kandev_es.application import Tasks, VersionConflict
from kandev_es.config import Settings
from kandev_es.creation import failpoints
from kandev_es.creation.driver import CreationDriver, Fenced
from kandev_es.creation.found import Holders, as_kind
from kandev_es.creation.handles import Handle, handle_hash, new_secret
from kandev_es.creation.outcomes import CreateResult, Outcome
from kandev_es.creation.placement import Placement, requested
from kandev_es.creation.request import load_create_request
from kandev_es.creation.steps.agent_launch import agent_limit_refusal
from kandev_es.creation.steps.registry import plan_step_names
from kandev_es.creation.validation import validate_against_workspace
from kandev_es.domain import creation
from kandev_es.domain.external_id import identity_id, normalize_external_id
from kandev_es.domain.identity import ABORTED, OUTCOME_CREATED_IDENTITY_LOST, Identity
from kandev_es.domain.ids import random_id
from kandev_es.domain.plan import CreationPlan
from kandev_es.domain.principal import Principal, Unconfirmed
from kandev_es.domain.task import Task
from kandev_es.domain.token import ApiToken
from kandev_es.domain.wip import WipLedger, wip_ledger_id
from kandev_es.domain.workspace import Workspace
from kandev_es.errors import (
    Conflict,
    CreationHandedOver,
    InternalError,
    InvalidExternalId,
    KandevError,
    TaskNotCreated,
)
from kandev_es.observability import serving, tracing
from kandev_es.storage.attestation import AttestationGuard
from kandev_es.views import task_dto

log = logging.getLogger("kandev_es.creation")

CLAIM_ATTEMPTS = 8


class _NotAdmitted(InternalError):
    """A body the snapshots cannot admit alone (it needs a read beyond them)."""


@dataclass(frozen=True)
class Claimed:
    """A saved claim: whose tenure, its task, the caller's handle, and the
    outcome when the claim's own save completed it (an inline plan)."""

    identity_id: uuid.UUID
    number: int
    task: Task
    handle: str
    outcome: str | None
    dto: dict[str, Any] | None = None  # the task's, made for the inline save


class CreationService:
    def __init__(
        self,
        app: Tasks,
        attestation: AttestationGuard,
        settings: Settings,
        driver: CreationDriver,
    ) -> None:
        self._app = app
        self._attestation = attestation
        self._lease = timedelta(seconds=settings.lease_seconds)
        self._driver = driver
        self._settings = settings
        self._owner_prefix = f"{socket.gethostname()}:{os.getpid()}"
        self._holders = Holders(app)

    # ----- the protocol ------------------------------------------------------
    def create(
        self,
        principal: Principal | Unconfirmed | None,
        body: Mapping[str, Any],
        placed: Placement | None = None,
    ) -> CreateResult:
        """``placed``: where the entry point decided the create lands
        (creation/placement.py); without it, where the body says (REST)."""
        try:
            # The data keys its reads open stay read for its later reads (a
            # found answer reads the identity, then its task: one key query).
            with tracing.span("create"), self._app.keys.held():
                result = self._create(principal, body, placed)
                tracing.note(**{"kandev.outcome": result.outcome.value})
        except Exception as error:
            metrics.record_creation_error(error)
            raise
        metrics.record_creation(result.outcome.value)
        return result

    def _create(
        self,
        caller: Principal | Unconfirmed | None,
        body: Mapping[str, Any],
        placed: Placement | None,
    ) -> CreateResult:
        # An Unconfirmed principal is confirmed by the first read below, in
        # the same query; a refusal before that read (the workspace is not
        # the token's) needs no read: a token's workspace never changes.
        unconfirmed = caller if isinstance(caller, Unconfirmed) else None
        principal = unconfirmed.principal if unconfirmed is not None else caller
        assert not isinstance(principal, Unconfirmed)
        raw_workspace = body.get("workspace_id") if placed is None else placed.workspace_id
        workspace_id = self._workspace_id(principal, raw_workspace)  # step 1
        serving.note_workspace(workspace_id)
        assert principal is not None
        invalid: InvalidExternalId | None = None
        try:
            external_id = normalize_external_id(body.get("external_id"))  # step 2
        except InvalidExternalId as error:
            # Authorization still answers first: read the workspace, then refuse.
            external_id, invalid = None, error
        key = identity_id(workspace_id, external_id) if external_id is not None else None
        reads, number, fields = self._read(principal, unconfirmed, workspace_id, key, body, placed)
        confirmed = self._confirmed(unconfirmed, reads)
        if confirmed is not None and confirmed != principal:
            return self._create(confirmed, body, placed)  # the token changed: start over
        workspace = self._authorized(reads[workspace_id])
        if invalid is not None:
            raise invalid
        identity: Identity | None = None
        if key is not None:
            self._attestation.require()
            identity = as_kind(reads[key], Identity)
            found = self._holders.found(identity, reads)  # step 3
            if found is not None:
                return found
            failpoints.hit(self._settings, "lookup:after")  # missed; nothing written yet
        if number is None or fields is None:
            fields = self._fields(body, workspace, placed)  # step 4: only after the lookup missed
            number = self._app.next_office_number(workspace.id)  # step 5
        # else drawn with the lookup: nothing moved since the snapshots that validated the body
        plan = self.plan(principal, workspace, external_id, number, fields)
        return self._claim_and_settle(principal, plan, new_secret(), identity, workspace)

    @staticmethod
    def plan(
        principal: Principal,
        workspace: Workspace,
        external_id: str | None,
        number: int,
        fields: dict[str, Any],
    ) -> CreationPlan:
        """The plan of a create whose body step 4 validated into ``fields``,
        with its office number (step 5)."""
        return CreationPlan(
            workspace_id=workspace.id,
            external_id=external_id,
            identifier=f"{workspace.task_prefix}-{number}",
            # The validated fields hold all the step rules read (attachments,
            # repositories and their paths, start_agent, wip_limit).
            steps=plan_step_names(fields),
            started_by_run=principal.run_id,
            **fields,
        )

    def _read(
        self,
        principal: Principal,
        unconfirmed: Unconfirmed | None,
        workspace_id: uuid.UUID,
        key: uuid.UUID | None,
        body: Mapping[str, Any],
        placed: Placement | None,
    ) -> tuple[dict[uuid.UUID, Any], int | None, dict[str, Any] | None]:
        """The lookup's one query: the workspace, the identity, (a guess from
        the last read) its holder's task and the caller's token, so a retry's
        whole Found is one round trip. A first create this process's
        snapshots already admit draws its office number in that query too,
        where the store can (no admission by snapshots where it cannot: its
        checks would only be made again after the read). Returns the reads,
        the number drawn (None: none) and the fields the snapshots admitted."""
        token = [unconfirmed.token_id] if unconfirmed is not None else []
        ids = [*self._holders.read_ids(workspace_id, key), *token]
        admitted = (
            self._admitted_by_snapshots(principal, unconfirmed, workspace_id, key, body, placed)
            if key is not None and self._app.draws_with_reads
            else None
        )
        with tracing.span("lookup"):
            if admitted is None:
                return self._app.read_many(ids), None, None
            reads, number = self._app.read_and_draw(ids, workspace_id, admitted[1])
        return reads, number, admitted[0]

    def _fields(
        self,
        body: Mapping[str, Any],
        workspace: Workspace,
        placed: Placement | None,
        from_snapshots: bool = False,
    ) -> dict[str, Any]:
        """Step 4, the one path a create's body takes: loaded (request.py),
        then validated against the workspace (validation.py). From snapshots
        (``_admitted_by_snapshots``): a body that needs a read beyond them
        (repositories, attachments, a parent) is ``NotAdmitted`` before any
        such read."""
        fields = load_create_request(body)
        reads_more = fields["repositories"] or fields["attachments"] or fields["parent_id"]
        if from_snapshots and reads_more:
            raise _NotAdmitted
        # The roots are resolved on the filesystem: only when a path is checked.
        roots = self._settings.allowed_repository_roots if fields["repositories"] else ()
        validate_against_workspace(self._app, workspace, fields, roots, placed)
        return fields

    def _admitted_by_snapshots(
        self,
        principal: Principal | None,
        unconfirmed: Unconfirmed | None,
        workspace_id: uuid.UUID,
        key: uuid.UUID,
        body: Mapping[str, Any],
        placed: Placement | None,
    ) -> tuple[dict[str, Any], dict[uuid.UUID, int]] | None:
        """The validated fields of an effect-free create, if this process's
        snapshots say it will claim (the identity never seen, the workspace
        live and accepting the body, the token still the caller's), and the
        versions of the snapshots that said so. The lookup then draws the
        office number only if none of them moved (so the number is claimed
        unless a concurrent create claims first, as without the draw). None:
        draw nothing, the create goes step by step."""
        if self._app.snapshot(key, Identity) is not None or not self._attestation.current.ok:
            return None
        workspace = self._app.snapshot(workspace_id, Workspace)
        if workspace is None or workspace.deleted:
            return None
        versions = {workspace_id: workspace.version}
        if unconfirmed is not None:
            token = self._app.snapshot(unconfirmed.token_id, ApiToken)
            if token is None or unconfirmed.confirm(token) != principal:
                return None
            versions[unconfirmed.token_id] = token.version
        try:
            fields = self._fields(body, workspace, placed, from_snapshots=True)
        except (KandevError, _NotAdmitted):
            return None  # the plain path answers it, after the lookup
        # Effects (a WIP limit, an agent): admission may still refuse after a draw.
        return None if plan_step_names(fields) else (fields, versions)

    def lookup(self, workspace_id: uuid.UUID, external_id: str) -> CreateResult | None:
        """Side-effect-free: what holds this identity right now, if anything."""
        self._attestation.require()
        return self._holders.lookup(workspace_id, external_id)

    # ----- the pieces a batch of creates reuses (bulk/) ---------------------
    @property
    def holders(self) -> Holders:
        """Step 3's answers (creation/found.py)."""
        return self._holders

    def require_attested(self) -> None:
        """External-ID traffic waits for the schema's attestation (AC-1)."""
        self._attestation.require()

    def authorized_workspace_id(
        self, principal: Principal | None, raw_workspace: object
    ) -> uuid.UUID:
        """Step 1 before any read: the workspace named (else the token's), if
        the principal may act on it; TaskNotCreated otherwise."""
        return self._workspace_id(principal, raw_workspace)

    def validated_fields(self, body: Mapping[str, Any], workspace: Workspace) -> dict[str, Any]:
        """Step 4: the body loaded and validated against the workspace."""
        return self._fields(body, workspace, None)

    def identity_to_claim(
        self, workspace_id: uuid.UUID, external_id: str | None, read: Identity | None
    ) -> Identity:
        """The identity a claim is saved on: the one read at the lookup loaded
        afresh (reads are never changed), else a new registration."""
        key = identity_id(workspace_id, external_id) if external_id is not None else uuid.uuid4()
        existing = self._app.load(key, Identity) if read is not None else None
        return existing or Identity.register(key, workspace_id, external_id)

    def answer(self, claimed: Claimed) -> CreateResult:
        """The Created answer of a saved inline claim (steps 8-9 done in it)."""
        return self._settle(claimed)

    # ----- steps -------------------------------------------------------------
    @staticmethod
    def _workspace_id(principal: Principal | None, raw_workspace: object) -> uuid.UUID:
        if principal is None:
            raise TaskNotCreated()
        workspace_id = requested(principal, raw_workspace)
        if workspace_id is None or not principal.may_act_on(workspace_id):
            raise TaskNotCreated()
        return workspace_id

    @staticmethod
    def _confirmed(
        unconfirmed: Unconfirmed | None, reads: Mapping[uuid.UUID, object]
    ) -> Principal | None:
        """None when there is nothing to confirm; the principal the token now
        gives otherwise (refused -- TaskNotCreated, as for no token -- if none)."""
        if unconfirmed is None:
            return None
        confirmed = unconfirmed.confirm(reads[unconfirmed.token_id])
        if confirmed is None:
            raise TaskNotCreated()
        return confirmed

    @staticmethod
    def _authorized(read: object) -> Workspace:
        workspace = as_kind(read, Workspace)
        if workspace is None or workspace.deleted:
            raise TaskNotCreated()
        return workspace

    def _claim_and_settle(
        self,
        principal: Principal,
        plan: CreationPlan,
        secret: str,
        read: Identity | None,
        workspace: Workspace,
    ) -> CreateResult:
        # A plan without effects has nothing to prepare, prove or recover:
        # it is claimed and completed in one transaction, which commits only
        # if the workspace has not changed since admission (a deletion
        # marked in between must not miss this task).
        inline = not plan.steps
        # One identity across the attempts, an anonymous one too: an attempt
        # that committed after all can then only be found, never doubled.
        key = (
            identity_id(plan.workspace_id, plan.external_id)
            if plan.external_id is not None
            else uuid.uuid4()
        )
        for attempt in range(CLAIM_ATTEMPTS):
            first = attempt == 0
            # On an inline plan's first attempt the workspace as the lookup
            # read it is the admission: no WIP limit then (else the plan would
            # reserve), and the guarded save commits only if it is unchanged.
            admitted = workspace if inline and first else self._admit(plan)  # step 6
            if isinstance(admitted, CreateResult):
                return admitted
            # The identity as read at the lookup, on the first attempt, when it
            # had no events: nothing to load (a concurrent first claim loses
            # at the version check and the next attempt loads).
            identity = self._load_or_register(plan, key, fresh=first and read is None)
            claimed = self._claim(  # step 7
                principal, plan, secret, identity, admitted if inline else None
            )
            if claimed is None:
                continue  # another create claimed first, or the workspace moved on
            if isinstance(claimed, CreateResult):
                return claimed
            return self._settle(claimed)  # steps 8-9
        raise Conflict("identity is contended; retry the create")

    def _admit(self, plan: CreationPlan) -> Workspace | CreateResult:
        """Admission, the pre-insert re-read: the workspace must still accept
        creates (and have capacity; a run starting an agent, an agent slot:
        steps/agent_launch.agent_limit_refusal). On refusal the identity is re-read first,
        so a holder still answers Found. Returns the workspace as read now."""
        ids = [plan.workspace_id, wip_ledger_id(plan.workspace_id)]
        reads = self._app.read_many(ids)
        current = as_kind(reads[plan.workspace_id], Workspace)
        refusal: KandevError | None = creation.admission_refusal(
            current, as_kind(reads[ids[1]], WipLedger)
        )
        if refusal is None and plan.start_agent:
            refusal = agent_limit_refusal(
                self._settings, str(plan.workspace_id), plan.started_by_run
            )
        if refusal is None:
            assert current is not None
            return current
        if plan.external_id is not None:
            found = self._holders.lookup(plan.workspace_id, plan.external_id)
            if found is not None:
                return found
        raise refusal

    @tracing.traced("claim")
    def _claim(
        self,
        principal: Principal,
        plan: CreationPlan,
        secret: str,
        identity: Identity,
        unchanged: Workspace | None,
    ) -> Claimed | CreateResult | None:
        """The claim (Claimed + Task.Created, one save): Found if the identity
        is held, None if the save lost a version check. With ``unchanged``
        (an inline plan) the save also completes the creation, and commits
        only if that workspace is still at the version admitted."""
        found = self._holders.found(identity)
        if found is not None:
            return found
        claimed = self.claimed(principal, plan, secret, identity, completed=unchanged is not None)
        try:
            self._app.save_atomically(
                identity,
                claimed.task,
                unchanged={unchanged.id: unchanged.version} if unchanged is not None else None,
                dtos={claimed.task.id: claimed.dto} if claimed.dto is not None else None,
            )
        except VersionConflict:
            return None
        log.info(
            "claimed workspace=%s identity=%s tenure=%s task=%s",
            plan.workspace_id, identity.id, claimed.number, claimed.task.id,
        )
        failpoints.hit(self._settings, "claim:after")
        return claimed

    def claimed(
        self,
        principal: Principal,
        plan: CreationPlan,
        secret: str,
        identity: Identity,
        completed: bool,
    ) -> Claimed:
        """The claim (Claimed + Task.Created) on ``identity`` and its task,
        unsaved: the caller saves both in one save. ``completed`` (an inline
        plan): the claim also completes the creation."""
        actor = principal.actor
        number, task = creation.claim(
            identity,
            plan,
            task_id=random_id(),
            owner_id=f"{self._owner_prefix}:{random_id()}",
            actor=actor,
            lease_expires_at=datetime.now(UTC) + self._lease,
            handle_hash=handle_hash(secret, actor, plan.plan_hash),
            completed=completed,
            request_id=serving.current_request_id(),
            traceparent=tracing.traceparent(),
        )
        outcome = identity.tenure(number).outcome if completed else None
        # An inline plan's task is final now: its DTO is the answer's and the
        # read model's alike, made once.
        dto = task_dto(task) if completed else None
        handle = str(Handle(identity.id, number, secret))
        return Claimed(identity.id, number, task, handle, outcome, dto)

    def _settle(self, claimed: Claimed) -> CreateResult:
        """Drive a claimed creation to its end (steps 8-9) and answer. An
        inline plan settled in its claim: only the answer is left."""
        if claimed.outcome is not None:
            dto = claimed.dto if claimed.dto is not None else task_dto(claimed.task)
            return CreateResult(_created(claimed.outcome), dto, claimed.handle)
        try:
            done = self._driver.drive(claimed.identity_id, claimed.number, epoch=0)
        except Fenced:
            raise CreationHandedOver(
                "this creation was taken over by the recovery runtime; retry the create"
            ) from None
        if done.tenure.phase == ABORTED:
            if done.error is not None:
                raise done.error
            raise Conflict("the creation was aborted")
        return CreateResult(_created(done.tenure.outcome), task_dto(done.task), claimed.handle)

    def _load_or_register(self, plan: CreationPlan, key: uuid.UUID, fresh: bool) -> Identity:
        existing = None if fresh else self._app.load(key, Identity)
        return existing or Identity.register(key, plan.workspace_id, plan.external_id)


def _created(tenure_outcome: str | None) -> Outcome:
    if tenure_outcome == OUTCOME_CREATED_IDENTITY_LOST:
        return Outcome.CREATED_IDENTITY_LOST
    return Outcome.CREATED
