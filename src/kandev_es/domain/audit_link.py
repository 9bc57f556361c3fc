"""Audit links: a short-lived credential for one identity's auditor page.

A browser cannot send a bearer header from a link, so ``identity history``
prints a link whose secret is in the URL. Least privilege: the secret only
reads the page of the one (workspace, external ID) it was issued for, until it
expires; it is no bearer token anywhere. Only its SHA-256 hash is stored, and
the aggregate id derives from that hash, so checking a link is one keyed read.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from eventsourcing.domain import Aggregate

from kandev_es.domain.token import hash_token

AUDIT_LINK_NAMESPACE = uuid.UUID("5f0c2a8e-93d1-4b6e-a7c4-2e8d1f9b3c60")


def audit_link_id_for(secret_hash: str) -> uuid.UUID:
    return uuid.uuid5(AUDIT_LINK_NAMESPACE, secret_hash)


class AuditLink(Aggregate):
    class Issued(Aggregate.Created):
        secret_hash: str
        workspace_id: uuid.UUID
        external_id: str
        expires_at: datetime
        issued_by: str

    def __init__(
        self,
        secret_hash: str,
        workspace_id: uuid.UUID,
        external_id: str,
        expires_at: datetime,
        issued_by: str,
    ) -> None:
        self.secret_hash = secret_hash
        self.workspace_id = workspace_id
        self.external_id = external_id
        self.expires_at = expires_at
        self.issued_by = issued_by

    @classmethod
    def issue(
        cls,
        secret: str,
        workspace_id: uuid.UUID,
        external_id: str,
        expires_at: datetime,
        issued_by: str,
    ) -> AuditLink:
        secret_hash = hash_token(secret)
        return cls._create(
            cls.Issued,
            id=audit_link_id_for(secret_hash),
            secret_hash=secret_hash,
            workspace_id=workspace_id,
            external_id=external_id,
            expires_at=expires_at,
            issued_by=issued_by,
        )

    def permits(self, workspace_id: uuid.UUID, external_id: str, now: datetime) -> bool:
        """Only the identity it was issued for, and only before it expires."""
        return (
            now < self.expires_at
            and self.workspace_id == workspace_id
            and self.external_id == external_id
        )
