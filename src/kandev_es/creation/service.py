"""The create protocol (DESIGN §4). Every entry point — REST, MCP, Office
runtime, agentctl — calls ``CreationService.create``; there is no other path."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import uuid
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from kandev_es.application import Tasks, VersionConflict
from kandev_es.config import Settings
from kandev_es.creation import failpoints
from kandev_es.creation.driver import CreationDriver, CreationHandedOver, Fenced
from kandev_es.creation.handles import Handle, handle_hash, new_secret
from kandev_es.creation.outcomes import CreateResult, Outcome
from kandev_es.creation.plan import CreationPlan
from kandev_es.creation.request import load_create_request
from kandev_es.creation.steps.registry import plan_step_names
from kandev_es.creation.steps.wip import CapacityExceeded
from kandev_es.creation.validation import validate_against_workspace
from kandev_es.domain.external_id import identity_id, normalize_external_id
from kandev_es.domain.identity import ABORTED, OUTCOME_CREATED_IDENTITY_LOST, Identity, Tenure
from kandev_es.domain.task import Task
from kandev_es.domain.wip import WipLedger, wip_ledger_id
from kandev_es.domain.workspace import Workspace
from kandev_es.errors import Conflict, TaskNotCreated, Unavailable
from kandev_es.services.auth import Principal
from kandev_es.storage.attestation import AttestationGuard
from kandev_es.storage.counters import next_office_number
from kandev_es.storage.database import Database
from kandev_es.views import task_dto

log = logging.getLogger("kandev_es.creation")

CLAIM_ATTEMPTS = 8


class CreationService:
    def __init__(
        self,
        app: Tasks,
        database: Database,
        attestation: AttestationGuard,
        settings: Settings,
    ) -> None:
        self._app = app
        self._database = database
        self._attestation = attestation
        self._lease = timedelta(seconds=settings.lease_seconds)
        self._driver = CreationDriver(app, settings)
        self._settings = settings
        self._owner_prefix = f"{socket.gethostname()}:{os.getpid()}"
        self.outcome_counts: Counter[str] = Counter()

    # ----- the protocol ------------------------------------------------------
    def create(self, principal: Principal | None, body: Mapping[str, Any]) -> CreateResult:
        result = self._create(principal, body)
        self.outcome_counts[result.outcome.value] += 1
        return result

    def _create(self, principal: Principal | None, body: Mapping[str, Any]) -> CreateResult:
        workspace = self._authorize(principal, body.get("workspace_id"))  # step 1
        assert principal is not None
        external_id = normalize_external_id(body.get("external_id"))  # step 2
        if external_id is not None:
            self._attestation.require()
            found = self._lookup(workspace.id, external_id)  # step 3
            if found is not None:
                return found
        fields = load_create_request(body)  # step 4: only after the lookup missed
        validate_against_workspace(self._app, workspace, fields)
        number = next_office_number(self._database, workspace.id)  # step 5
        plan = CreationPlan(
            workspace_id=workspace.id,
            external_id=external_id,
            identifier=f"{workspace.task_prefix}-{number}",
            **fields,
        )
        plan = dataclasses.replace(plan, steps=plan_step_names(plan.to_manifest()))
        found = self._admit(workspace, external_id)  # step 6
        if found is not None:
            return found
        secret = new_secret()
        claimed = self._claim(principal, plan, secret)  # step 7
        if isinstance(claimed, CreateResult):
            return claimed
        identity, tenure, _ = claimed
        failpoints.hit(self._settings, "claim:after")
        return self._finish(identity.id, tenure.number, secret)  # steps 8-9

    def lookup(self, workspace_id: uuid.UUID, external_id: str) -> CreateResult | None:
        """Side-effect-free: what holds this identity right now, if anything."""
        self._attestation.require()
        return self._lookup(workspace_id, external_id)

    # ----- steps -------------------------------------------------------------
    def _authorize(self, principal: Principal | None, raw_workspace: object) -> Workspace:
        if principal is None:
            raise TaskNotCreated("not authorized")
        workspace_id: uuid.UUID | None
        if raw_workspace is None:
            workspace_id = principal.workspace_id
        else:
            try:
                workspace_id = uuid.UUID(str(raw_workspace))
            except ValueError:
                workspace_id = None
        if workspace_id is None or not principal.may_act_on(workspace_id):
            raise TaskNotCreated("not authorized")
        workspace = self._app.read(workspace_id, Workspace)
        if workspace is None or workspace.deleted:
            raise TaskNotCreated("unknown workspace")
        return workspace

    def _lookup(self, workspace_id: uuid.UUID, external_id: str) -> CreateResult | None:
        identity = self._app.read(identity_id(workspace_id, external_id), Identity)
        if identity is None:
            return None
        return self._found(identity)

    def _found(self, identity: Identity) -> CreateResult | None:
        holder = identity.holder
        if holder is None:
            return None
        task = self._app.read(holder.task_id, Task)
        if task is None:  # pragma: no cover - Claimed and Task.Created share one save
            raise Unavailable("identity holder has no task stream")
        outcome = Outcome.FOUND_SETTLED if holder.settled else Outcome.FOUND_UNSETTLED
        return CreateResult(outcome, task_dto(task))

    def _admit(self, workspace: Workspace, external_id: str | None) -> CreateResult | None:
        """Admission: the workspace must still accept creates. On refusal the
        identity is re-read first, so a holder still answers Found."""
        current = self._app.read(workspace.id, Workspace)
        refusal: Exception | None = None
        if current is None or current.deleted:
            refusal = TaskNotCreated("workspace no longer accepts creates")
        elif current.wip_limit is not None:
            ledger = self._app.read(wip_ledger_id(workspace.id), WipLedger)
            in_use = len(ledger.reserved) if ledger else 0
            if in_use >= current.wip_limit:
                refusal = CapacityExceeded(
                    f"workspace WIP limit {current.wip_limit} reached",
                    wip_limit=current.wip_limit,
                )
        if refusal is None:
            return None
        if external_id is not None:
            found = self._lookup(workspace.id, external_id)
            if found is not None:
                return found
        raise refusal

    def _claim(
        self, principal: Principal, plan: CreationPlan, secret: str
    ) -> CreateResult | tuple[Identity, Tenure, Task]:
        for _ in range(CLAIM_ATTEMPTS):
            identity = self._load_or_register(plan)
            found = self._found(identity)
            if found is not None:
                return found
            task_id = uuid.uuid4()
            tenure = identity.claim(
                task_id=task_id,
                owner_id=f"{self._owner_prefix}:{uuid.uuid4()}",
                actor=principal.actor,
                plan=plan.to_manifest(),
                plan_hash=plan.plan_hash,
                lease_expires_at=datetime.now(UTC) + self._lease,
                handle_hash=handle_hash(secret, principal.actor, plan.plan_hash),
            )
            task = Task.create(
                task_id,
                workspace_id=plan.workspace_id,
                identity_id=identity.id,
                identifier=plan.identifier,
                external_id=plan.external_id,
                title=plan.title,
                description=plan.description,
                workflow=plan.workflow,
                workflow_step=plan.workflow_step,
                parent_id=plan.parent_id,
                repositories=plan.repositories,
                attachments=plan.attachments,
                start_agent=plan.start_agent,
                agent_profile=plan.agent_profile,
                created_by=principal.actor,
            )
            try:
                self._app.save_atomically(identity, task)
            except VersionConflict:
                # The backstop: another create claimed first. Re-read.
                continue
            log.info(
                "claimed workspace=%s identity=%s tenure=%s task=%s",
                plan.workspace_id, identity.id, tenure.number, task_id,
            )
            return identity, tenure, task
        raise Conflict("identity is contended; retry the create")

    def _load_or_register(self, plan: CreationPlan) -> Identity:
        if plan.external_id is None:
            return Identity.register(uuid.uuid4(), plan.workspace_id, None)
        key = identity_id(plan.workspace_id, plan.external_id)
        existing = self._app.load(key, Identity)
        return existing or Identity.register(key, plan.workspace_id, plan.external_id)

    def _finish(self, identity_id: uuid.UUID, number: int, secret: str) -> CreateResult:
        try:
            done = self._driver.drive(identity_id, number, epoch=0)
        except Fenced:
            raise CreationHandedOver(
                "this creation was taken over by the recovery runtime; retry the create"
            ) from None
        if done.tenure.phase == ABORTED:
            if done.error is not None:
                raise done.error
            raise Conflict("the creation was aborted")
        outcome = (
            Outcome.CREATED_IDENTITY_LOST
            if done.tenure.outcome == OUTCOME_CREATED_IDENTITY_LOST
            else Outcome.CREATED
        )
        return CreateResult(outcome, task_dto(done.task), str(Handle(identity_id, number, secret)))
