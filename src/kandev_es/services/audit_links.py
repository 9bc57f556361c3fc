"""Issue and check audit links (domain/audit_link.py): the auditor's page of one
identity, reachable from a browser for a few minutes without a bearer token."""

from __future__ import annotations

import hmac
import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from kandev_es.application import Tasks
from kandev_es.domain.audit_link import AuditLink, audit_link_id_for
from kandev_es.domain.token import hash_token, well_formed

LINK_PREFIX = "kal_"
# The query parameter the page reads; the access log redacts it (api/access_log.py).
LINK_PARAMETER = "audit_link"
PAGE_PATH = "/audit/identities"


@dataclass(frozen=True)
class IssuedLink:
    url: str
    expires_at: datetime


def page_query(workspace_id: uuid.UUID, external_id: str) -> dict[str, str]:
    return {"workspace": str(workspace_id), "external_id": external_id}


class AuditLinkService:
    def __init__(self, app: Tasks, ttl_seconds: float) -> None:
        self._app = app
        self._ttl = timedelta(seconds=ttl_seconds)

    def issue(
        self, base_url: str, workspace_id: uuid.UUID, external_id: str, issued_by: str
    ) -> IssuedLink:
        """A fresh link for this one identity; the secret is shown only in the URL."""
        secret = LINK_PREFIX + secrets.token_urlsafe(32)
        expires_at = datetime.now(UTC) + self._ttl
        link = AuditLink.issue(secret, workspace_id, external_id, expires_at, issued_by)
        self._app.save_atomically(link)
        query = urlencode({**page_query(workspace_id, external_id), LINK_PARAMETER: secret})
        return IssuedLink(f"{base_url.rstrip('/')}{PAGE_PATH}?{query}", expires_at)

    def permits(self, secret: str | None, workspace_id: uuid.UUID, external_id: str) -> bool:
        """True only for an unexpired link issued for exactly this identity."""
        if not well_formed(secret, LINK_PREFIX):
            return False
        secret_hash = hash_token(secret)
        link = self._app.load(audit_link_id_for(secret_hash), AuditLink)
        if link is None or not hmac.compare_digest(link.secret_hash, secret_hash):
            return False
        return link.permits(workspace_id, external_id, datetime.now(UTC))
