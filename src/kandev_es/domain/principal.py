"""Who acts: the principal a bearer token authenticates as, and what it may act
on. A value shared by every layer above the domain (creation, services, the
adapters), so it lives here rather than with the token service."""

from __future__ import annotations

import hmac
import uuid
from dataclasses import dataclass, field

from kandev_es.domain.token import ApiToken
from kandev_es.errors import IdentityNotFound, NotFound, OperatorRequired, WorkspaceNotFound

MEMBER, OPERATOR = "member", "operator"
ROLES = (MEMBER, OPERATOR)


@dataclass(frozen=True)
class Principal:
    token_id: uuid.UUID
    admin: bool
    workspace_id: uuid.UUID | None
    # Set only for a run credential (issued at agent launch): the run it is bound
    # to and the task that run belongs to. Workspace and admin tokens: None.
    run_id: str | None = None
    task_id: uuid.UUID | None = None
    role: str = MEMBER
    # Set only for the local CLI (``LOCAL_CLI``), which has no token: what its
    # acts are recorded as.
    local_actor: str | None = None

    @property
    def actor(self) -> str:
        return self.local_actor or f"token:{self.token_id}"

    def may_act_on(self, workspace_id: uuid.UUID) -> bool:
        return self.admin or self.workspace_id == workspace_id

    def is_operator_of(self, workspace_id: uuid.UUID) -> bool:
        return self.admin or (self.role == OPERATOR and self.workspace_id == workspace_id)


# The local CLI reaches the store directly, with the store's own credentials
# (which already allow everything): it acts on every workspace, with no token,
# and its acts are recorded as "cli" (as its release records them).
LOCAL_CLI = Principal(
    token_id=uuid.UUID(int=0), admin=True, workspace_id=None, role=OPERATOR, local_actor="cli"
)


def principal_of(token: object, token_hash: str) -> Principal | None:
    """The principal a bearer token (``token``, read by the id its hash
    derives) authenticates as: None if missing, revoked, or a run credential
    (no principal off the run routes, see ``TokenService.authenticate_run``)."""
    if not isinstance(token, ApiToken) or token.revoked or token.run_id is not None:
        return None
    # The id already derives from the hash; compare anyway, in constant time.
    if not hmac.compare_digest(token.token_hash, token_hash):
        return None
    return Principal(
        token.id, token.admin, token.workspace_id, token.run_id, token.task_id, token.role
    )


@dataclass(frozen=True)
class Unconfirmed:
    """A bearer token's principal as this process last read the token, not yet
    checked against the store. Whoever takes one reads ``token_id`` in its own
    first query and acts only on what ``confirm`` makes of that fresh read: so
    a create pays one round trip, not two, and a revocation by any process is
    still refused on the very next request."""

    principal: Principal
    token_hash: str = field(repr=False)

    @property
    def token_id(self) -> uuid.UUID:
        return self.principal.token_id

    def confirm(self, token: object) -> Principal | None:
        """The principal as ``token`` (just read from the store) now says."""
        return principal_of(token, self.token_hash)


def require_operator(
    principal: Principal | None,
    workspace_id: uuid.UUID,
    unseen: NotFound | None = None,
    needing: str = "this",
) -> Principal:
    """An admin or an operator of the workspace. A member that is not its
    operator gets 403 operator_required (``needing`` says what needs one);
    anyone else learns nothing: ``unseen``, by default the workspace's 404."""
    if principal is None or not principal.may_act_on(workspace_id):
        raise unseen or WorkspaceNotFound("workspace not found")
    if not principal.is_operator_of(workspace_id):
        raise OperatorRequired(f"{needing} needs an operator token of the workspace")
    return principal


def require_auditor(principal: Principal | None, workspace_id: uuid.UUID) -> Principal:
    """Who may read an identity's history, as JSON or as the auditor's page: the
    operator rule, with 404 ``identity not found`` for anyone else, whether or
    not the identity exists."""
    return require_operator(
        principal, workspace_id, IdentityNotFound("identity not found"), "an identity's history"
    )
