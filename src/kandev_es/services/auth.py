"""Bearer tokens: issue (shown once, stored hashed) and authenticate."""

from __future__ import annotations

import hmac
import secrets
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from eventsourcing.utils import get_topic

from kandev_es.application import Tasks
from kandev_es.domain.principal import MEMBER, ROLES, Principal, Unconfirmed, principal_of
from kandev_es.domain.token import (
    ApiToken,
    RunCredentialRevoked,
    hash_token,
    run_token_id_for,
    token_id_for,
    well_formed,
)
from kandev_es.errors import TokenNotFound

TOKEN_PREFIX = "kes_"


def bearer_of(authorization: str) -> str | None:
    """The secret of an ``Authorization: Bearer <secret>`` value, for every
    transport (REST, Office, MCP over HTTP); another scheme or none is None."""
    scheme, _, secret = authorization.partition(" ")
    return (secret.strip() or None) if scheme.lower() == "bearer" else None


# Why a refused request's own credential could not be a token at all: said
# to the caller (it learns only what it sent), unlike a token that is simply
# not valid for the workspace it names (errors.NOT_VALID_FOR_WORKSPACE).
NO_BEARER_TOKEN = (
    "no bearer token was sent: send Authorization: Bearer <token>"
    " (`kandev-es token create` makes one)"
)
NOT_A_BEARER_TOKEN = (
    "the Authorization header is not a bearer token (only Bearer is accepted):"
    " send Authorization: Bearer <token>"
)
MALFORMED_TOKEN = "the bearer token is malformed: a kandev-es token begins kes_"


def credential_problem(authorization: str | None) -> tuple[str, bool] | None:
    """What is wrong with an ``Authorization`` value before any lookup: the
    message and whether a bearer token was sent at all (False: the answer
    carries ``WWW-Authenticate: Bearer``); None when it is a well-formed
    bearer token (valid or not: that is the store's to say)."""
    scheme, _, rest = (authorization or "").strip().partition(" ")
    if not scheme or (scheme.lower() == "bearer" and not rest.strip()):
        return NO_BEARER_TOKEN, False
    secret = bearer_of(authorization or "")
    if secret is None:
        return NOT_A_BEARER_TOKEN, False
    if not well_formed(secret, TOKEN_PREFIX):
        return MALFORMED_TOKEN, True
    return None


DEFAULT_RUN_TOKEN_TTL = 24 * 3600.0
ISSUED_TOPIC = get_topic(ApiToken.Issued)


def token_dto(token: ApiToken) -> dict[str, Any]:
    """What a listing shows of a token: never its secret or its hash."""
    return {
        "id": token.id,
        "role": token.role,
        "workspace_id": token.workspace_id,
        "label": token.label,
        "run_id": token.run_id,
        "created_on": token.created_on,
        "revoked": token.revoked,
    }


class TokenService:
    def __init__(self, app: Tasks, run_token_ttl: float = DEFAULT_RUN_TOKEN_TTL) -> None:
        self._app = app
        self._run_ttl = timedelta(seconds=run_token_ttl)

    def issue(
        self,
        *,
        workspace_id: uuid.UUID | None,
        admin: bool,
        label: str = "",
        run_id: str | None = None,
        task_id: uuid.UUID | None = None,
        role: str = MEMBER,
    ) -> tuple[str, Principal]:
        if admin == (workspace_id is not None):
            raise ValueError("a token is either admin or bound to exactly one workspace")
        if run_id is not None and admin:
            raise ValueError("a run credential is bound to one workspace, never admin")
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        if run_id is not None:
            existing = self._app.load(run_token_id_for(run_id), ApiToken)
            if existing is not None:
                if existing.revoked:
                    raise RunCredentialRevoked(f"run {run_id} has ended")
                existing.rekey(hash_token(secret))
                self._app.save_atomically(existing)
                return secret, Principal(existing.id, False, workspace_id, run_id, task_id)
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}")
        token = ApiToken.issue(
            hash_token(secret), workspace_id, admin, label, run_id=run_id, task_id=task_id
        )
        if not admin and run_id is None:
            token.scope(role)
        self._app.save_atomically(token)
        return secret, Principal(token.id, admin, workspace_id, run_id, task_id, token.role)

    def issue_run(self, workspace_id: uuid.UUID, run_id: str, task_id: uuid.UUID) -> str:
        """The secret of a run credential for an agent launch (the creation
        steps' RunCredentials); RunCredentialRevoked once the run has ended."""
        secret, _ = self.issue(
            workspace_id=workspace_id,
            admin=False,
            label=f"run:{run_id}",
            run_id=run_id,
            task_id=task_id,
        )
        return secret

    def authenticate(self, secret: str | None) -> Principal | None:
        if not well_formed(secret, TOKEN_PREFIX):
            return None
        token_hash = hash_token(secret)
        # A shared snapshot caught up by one query for the events after it (no
        # decoding, no copy when nothing changed): still a read of the store on
        # every request, so a revocation by any process refuses the next one.
        return principal_of(self._app.read(token_id_for(token_hash), ApiToken), token_hash)

    def authenticate_unconfirmed(self, secret: str | None) -> Principal | Unconfirmed | None:
        """Without a query when this process has read the token before (an
        ``Unconfirmed`` its caller must confirm); otherwise ``authenticate``."""
        if not well_formed(secret, TOKEN_PREFIX):
            return None
        token_hash = hash_token(secret)
        known = principal_of(self._app.snapshot(token_id_for(token_hash), ApiToken), token_hash)
        if known is None:  # never read here, or refused then: ask the store now
            return self.authenticate(secret)
        return Unconfirmed(known, token_hash)

    def authenticate_run(self, secret: str | None, run_id: str | None) -> Principal | None:
        """A run credential plus the run id it is bound to (``X-Kandev-Run-Id``).
        Anything else — a workspace or admin token, a missing or different run
        id — is no principal at all, so the caller sees the usual refusal."""
        if not well_formed(secret, TOKEN_PREFIX):
            return None
        if not run_id or len(run_id) > 200:
            return None
        token = self._app.read(run_token_id_for(run_id), ApiToken)
        if token is None or token.revoked or token.run_id != run_id:
            return None
        if not hmac.compare_digest(token.token_hash, hash_token(secret)):
            return None
        # Bounds a run whose end was never observed (KANDEV_RUN_TOKEN_TTL).
        if datetime.now(UTC) - token.modified_on > self._run_ttl:
            return None
        return Principal(token.id, False, token.workspace_id, token.run_id, token.task_id, "run")

    def revoke_run(self, run_id: str, reason: str) -> bool:
        """Revoke the run's credential (idempotent); True if this call revoked it."""

        def revoke(token: ApiToken | None) -> bool:
            if token is None or token.revoked:
                return False
            token.revoke(reason)
            return True

        return self._app.retry_on_conflict(
            lambda: self._app.load(run_token_id_for(run_id), ApiToken),
            revoke,
            contended="the run credential keeps changing; retry",
        )

    def list_tokens(self) -> list[dict[str, Any]]:
        """Every token ever issued (run credentials too), oldest first."""
        ids = self._app.originators(ISSUED_TOPIC)
        found = self._app.read_many(ids)
        return [token_dto(t) for t in found.values() if isinstance(t, ApiToken)]

    def revoke(self, token_id: uuid.UUID, reason: str = "revoked") -> dict[str, Any]:
        """Revoke any token by id; revoking a revoked token changes nothing.
        It is refused from its next request: authenticate reads it afresh."""

        def revoke(token: ApiToken | None) -> dict[str, Any]:
            if token is None:
                raise TokenNotFound("token not found")
            if not token.revoked:
                token.revoke(reason)
            return token_dto(token)

        return self._app.retry_on_conflict(
            lambda: self._app.load(token_id, ApiToken),
            revoke,
            contended="the token keeps changing; retry",
        )
