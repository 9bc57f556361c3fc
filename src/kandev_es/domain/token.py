"""API tokens. Only a SHA-256 hash is ever stored; the aggregate id derives from
that hash so authentication is one keyed read."""

from __future__ import annotations

import functools
import hashlib
import uuid
from typing import TypeGuard

from eventsourcing.domain import Aggregate, event

from kandev_es.domain.agent_session import session_id_for
from kandev_es.domain.errors import DomainRuleBroken

TOKEN_NAMESPACE = uuid.UUID("a3e1c6d2-7b94-4f08-8d2e-61c9b5f0e4a7")


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


MAX_SECRET_LENGTH = 200


def well_formed(secret: str | None, prefix: str) -> TypeGuard[str]:
    """A presented secret worth hashing and looking up: ours by its prefix and
    not oversized (anything else is refused without touching the store)."""
    return secret is not None and secret.startswith(prefix) and len(secret) <= MAX_SECRET_LENGTH


@functools.lru_cache(maxsize=4096)  # every request of a token asks again (SHA-1)
def token_id_for(token_hash: str) -> uuid.UUID:
    return uuid.uuid5(TOKEN_NAMESPACE, token_hash)


def run_token_id_for(run_id: str) -> uuid.UUID:
    """A run credential's id derives from its run, so whatever ends the run can
    revoke it without knowing the secret, and a workspace-token lookup by hash
    never finds it."""
    return uuid.uuid5(TOKEN_NAMESPACE, f"run:{run_id}")


def run_credential_id_of_task(task_id: uuid.UUID) -> uuid.UUID:
    """The id of the credential of a task's agent run (its run id is the task's
    agent session id): what ends the task ends it too."""
    return run_token_id_for(str(session_id_for(task_id)))


def end_run(token: ApiToken | None, reason: str) -> None:
    """Revoke a run credential loaded to be saved together with the change that
    ends its run (archive, delete), so no crash between two saves can leave an
    ended task's credential alive; one already revoked (or never issued) stays."""
    if token is not None and not token.revoked:
        token.revoke(reason)


class RunCredentialRevoked(DomainRuleBroken):
    """The run's credential was revoked (the run ended); it is never reissued."""


class ApiToken(Aggregate):
    class Issued(Aggregate.Created):
        token_hash: str
        workspace_id: uuid.UUID | None
        admin: bool
        label: str
        # A run credential (issued at agent launch) is bound to its run and task.
        # Events stored before these fields existed replay with None.
        run_id: str | None
        task_id: uuid.UUID | None

    def __init__(
        self,
        token_hash: str,
        workspace_id: uuid.UUID | None,
        admin: bool,
        label: str,
        run_id: str | None = None,
        task_id: uuid.UUID | None = None,
    ) -> None:
        self.token_hash = token_hash
        self.workspace_id = workspace_id
        self.admin = admin
        self.label = label
        self.run_id = run_id
        self.task_id = task_id
        self.revoked = False
        # Workspace tokens stored before roles existed carry no Scoped event and
        # replay as operators, so existing installs keep every right they had.
        self.role = "admin" if admin else ("run" if run_id is not None else "operator")

    @event("Scoped")
    def scope(self, role: str) -> None:
        self.role = role

    @classmethod
    def issue(
        cls,
        token_hash: str,
        workspace_id: uuid.UUID | None,
        admin: bool,
        label: str,
        *,
        run_id: str | None = None,
        task_id: uuid.UUID | None = None,
    ) -> ApiToken:
        return cls._create(
            cls.Issued,
            id=run_token_id_for(run_id) if run_id is not None else token_id_for(token_hash),
            token_hash=token_hash,
            workspace_id=workspace_id,
            admin=admin,
            label=label,
            run_id=run_id,
            task_id=task_id,
        )

    @event("Rekeyed")
    def rekey(self, token_hash: str) -> None:
        """A relaunch of the same run (its first launch never started a process)
        gets a fresh secret; the old one stops working."""
        self.token_hash = token_hash

    @event("Revoked")
    def revoke(self, reason: str) -> None:
        self.revoked = True

    def may_act_on(self, workspace_id: uuid.UUID) -> bool:
        return not self.revoked and (self.admin or self.workspace_id == workspace_id)
